"""The job store: every operation against a reference, waits and timeouts, and strangers refused
(no secret, a wrong secret, torch's TCPStore client, random bytes) while the job's clients go on."""
from __future__ import annotations

import datetime
import socket
import threading
import time

import pytest
import torch
import torch.distributed as dist

from ringlet.security import AuthError, client_handshake, new_secret, server_handshake
from ringlet.security.secret import SECRET_ENV, job_secret, prove, verify
from ringlet.security.strangers import reset
from ringlet.store import StoreClient, StoreError, StoreServer, StoreTimeout
from ringlet.store.torch_store import RingletStore, connect

SECRET = bytes.fromhex(new_secret())


@pytest.fixture
def server():
    reset()
    s = StoreServer("127.0.0.1", 0, SECRET)
    yield s
    s.close()


def refusals(caplog) -> int:
    return sum("the job's store refused a connection from ('127.0.0.1'" in r.getMessage() for r in caplog.records)


def client(server, secret=SECRET, **kw):
    return StoreClient("127.0.0.1", server.port, secret, timeout=kw.pop("timeout", 5.0), connect_timeout=2.0)


def test_operations_match_a_dict(server):
    c = client(server)
    c.set("a", b"1")
    c.set("b", "two")
    assert c.get("a") == b"1" and c.get("b") == b"two"
    assert c.add("n", 5) == 5 and c.add("n", -2) == 3 and c.get("n") == b"3"
    assert c.check(["a", "b"]) and not c.check(["a", "zz"])
    assert c.compare_set("cs", "", "x") == b"x" and c.compare_set("cs", "y", "z") == b"x"
    assert c.compare_set("cs", "x", "z") == b"z"
    c.append("l", "1,")
    c.append("l", "2,")
    assert c.get("l") == b"1,2,"
    c.multi_set(["m1", "m2"], [b"p", b"q"])
    assert c.multi_get(["m1", "m2"]) == [b"p", b"q"]
    assert c.num_keys() == 7
    assert c.delete_key("a") and not c.delete_key("a")
    c.set("empty", b"")
    assert c.get("empty") == b""


def test_get_waits_for_another_client(server):
    a, b = client(server), client(server)
    threading.Timer(0.2, lambda: b.set("late", "v")).start()
    assert a.get("late") == b"v"
    a.wait(["late"])


def test_waits_time_out(server):
    c = client(server)
    with pytest.raises(StoreTimeout):
        c.get("never", timeout=0.2)
    with pytest.raises(StoreTimeout):
        c.wait(["never"], timeout=0.2)
    c.set("k", "still usable")
    assert c.get("k") == b"still usable"


@pytest.mark.parametrize("secret", [None, bytes(32)], ids=["no-secret", "wrong-secret"])
def test_clients_without_the_secret_are_refused(server, secret, caplog):
    with pytest.raises(AuthError):
        StoreClient("127.0.0.1", server.port, secret if secret is not None else b"x" * 32, connect_timeout=2.0) \
            if secret is not None else _plain_protocol_client(server)
    good = client(server)
    good.set("k", "v")
    assert good.get("k") == b"v"
    deadline = time.monotonic() + 5.0  # the server's thread notices the intruder in its own time (a loaded host)
    while server.refused < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.refused >= 1
    assert refusals(caplog) == 1


def _plain_protocol_client(server):
    """A client that speaks the store protocol but skips the handshake."""
    from ringlet.store.protocol import Op, send

    s = socket.create_connection(("127.0.0.1", server.port), timeout=2.0)
    send(s, Op.SET, [b"intruder", b"1"])
    time.sleep(0.3)
    raise AuthError("sent")


def test_torch_tcpstore_client_and_random_bytes_are_refused_and_logged_once(server, caplog):
    with pytest.raises(Exception):
        dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=2))
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port), timeout=2.0) as s:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n" * 10)
            s.settimeout(2.0)
            try:
                while s.recv(4096):
                    pass
            except OSError:
                pass
    good = client(server)
    assert not good.check(["intruder"])
    assert good.num_keys() == 0
    assert server.refused >= 4
    assert refusals(caplog) == 1  # once per address


def test_a_server_without_the_secret_is_not_trusted():
    lst = socket.create_server(("127.0.0.1", 0))
    port = lst.getsockname()[1]

    def impostor():
        conn, _ = lst.accept()
        try:
            server_handshake(conn, bytes(32), timeout=2.0)
        except AuthError:
            pass
        conn.close()

    threading.Thread(target=impostor, daemon=True).start()
    with pytest.raises(AuthError):
        StoreClient("127.0.0.1", port, SECRET, connect_timeout=2.0)
    lst.close()


def test_handshake_roundtrip_over_a_socket_pair():
    a, b = socket.socketpair()
    t = threading.Thread(target=server_handshake, args=(a, SECRET, 2.0))
    t.start()
    client_handshake(b, SECRET, 2.0)
    t.join()


def test_secret_parsing_and_macs():
    assert job_secret({}) is None
    assert job_secret({SECRET_ENV: SECRET.hex()}) == SECRET
    for bad in ("zz", "ab" * 4):
        with pytest.raises(ValueError):
            job_secret({SECRET_ENV: bad})
    mac = prove(SECRET, b"role", b"a", b"bc")
    assert verify(SECRET, mac, b"role", b"a", b"bc")
    assert not verify(SECRET, mac, b"role", b"ab", b"c")  # parts are length-prefixed
    assert not verify(SECRET, mac, b"other", b"a", b"bc")


def test_ringlet_store_carries_a_gloo_group(server, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET.hex())
    st = connect("127.0.0.1", server.port, timeout=5.0)
    assert isinstance(st, RingletStore)
    dist.init_process_group("gloo", store=dist.PrefixStore("t", st), rank=0, world_size=1)
    try:
        t = torch.ones(3)
        dist.all_reduce(t)
        g = dist.new_group([0])
        dist.all_reduce(t, group=g)
        assert t.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()
    with pytest.raises(dist.DistStoreError):
        st.set_timeout(datetime.timedelta(seconds=0.2))
        st.get("never")


def test_connect_without_a_secret_is_torchs_store(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    srv = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=5), wait_for_workers=False)
    st = connect("127.0.0.1", srv.port, timeout=5.0)
    assert isinstance(st, dist.TCPStore)


def test_a_closed_server_fails_clients_clearly():
    s = StoreServer("127.0.0.1", 0, SECRET)
    c = StoreClient("127.0.0.1", s.port, SECRET, timeout=2.0)
    s.close()
    with pytest.raises(StoreError):
        for _ in range(50):  # the close reaches the client within a few tenths of a second, later on a loaded machine
            c.set("k", "v")
            time.sleep(0.1)


def test_a_client_still_in_its_handshake_when_the_server_closes_is_dropped(monkeypatch):
    import ringlet.store.server as server_mod

    real = server_mod.server_handshake

    def slow_server_side(conn, secret, timeout):  # the client is through; the server has not yet registered it
        real(conn, secret, timeout)
        time.sleep(0.5)

    monkeypatch.setattr(server_mod, "server_handshake", slow_server_side)
    s = StoreServer("127.0.0.1", 0, SECRET)
    c = StoreClient("127.0.0.1", s.port, SECRET, timeout=2.0)
    s.close()
    with pytest.raises(StoreError):
        c.set("k", "v")

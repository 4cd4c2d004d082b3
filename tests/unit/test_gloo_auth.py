"""The pieces that guard ringlet's Gloo groups: the pair challenge over real Gloo pairs (ranks as threads
of this process, each with its own ``ProcessGroupGloo``), the stranger watch over plain sockets, the
endpoint tables and the choice of interface. Real processes: tests/multiproc/test_transport_auth.py."""
from __future__ import annotations

import datetime
import itertools
import os
import socket
import threading

import pytest
import torch
import torch.distributed as dist

from ringlet.security import strangers
from ringlet.transport import _gloo_auth as auth
from ringlet.transport import _gloo_bind as bind
from ringlet.transport import _gloo_endpoints as ends
from ringlet.transport import _gloo_guard as guard
from ringlet.transport._gloo_watch import StrangerWatch
from ringlet.types import PeerError

SECRET = bytes(range(32))
_prefix = itertools.count()


def gloo_world(n: int, timeout: float = 20.0):
    """``n`` Gloo process groups of one world in this process; (groups, listeners opened for them)."""
    store, prefix = dist.HashStore(), f"w{next(_prefix)}"
    before = set(ends.socket_inodes())
    pgs = [None] * n

    def make(r):
        pgs[r] = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), r, n, datetime.timedelta(seconds=timeout))

    run_threads(n, make)
    return pgs, guard.new_listeners(before)


def run_threads(n: int, fn):
    """``fn(r)`` for every r on its own thread; the results (or the exception each raised) in rank order."""
    out: list = [None] * n

    def body(r):
        try:
            out[r] = fn(r)
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            out[r] = exc

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a rank hung"
    return out


def views(pgs, listeners):
    """One listener per rank (which rank's it really is cannot be told apart inside one process)."""
    eps = sorted(set(listeners.values()))
    return [auth.GroupView(pg, tuple(range(len(pgs))), r, eps[r:r + 1]) for r, pg in enumerate(pgs)]


# ---- the pair challenge over real Gloo pairs ---------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 5])
def test_every_pair_authenticates_and_the_group_still_works(n):
    pgs, listeners = gloo_world(n)
    vs = views(pgs, listeners)
    results = run_threads(n, lambda r: auth.authenticate_group(vs[r], SECRET, 20.0))
    assert all(isinstance(res, auth.AuthResult) for res in results), results
    connected = {c.local for c, _ in ends.own_connections() if c.remote in set(listeners.values())}
    assert all(res.complete and res.legit <= connected for res in results)
    assert set().union(*(res.legit for res in results))  # some rank listens for the others
    # The pairs carry traffic afterwards: a ring of point-to-point messages.
    def ring(r):
        got = torch.zeros(3)
        rw = pgs[r].recv([got], (r - 1) % n, 7)
        pgs[r].send([torch.full((3,), float(r))], (r + 1) % n, 7).wait()
        rw.wait()
        return got
    assert [float(t[0]) for t in run_threads(n, ring)] == [float((r - 1) % n) for r in range(n)]


@pytest.mark.parametrize("n", [2, 3])
def test_a_rank_without_the_secret_fails_on_every_rank(n):
    pgs, listeners = gloo_world(n)
    vs = views(pgs, listeners)
    bad = 1
    results = run_threads(n, lambda r: auth.authenticate_group(vs[r], bytes(32) if r == bad else SECRET, 20.0))
    for r, res in enumerate(results):
        assert isinstance(res, auth.PairAuthError) and isinstance(res, PeerError), (r, res)
        assert "failed authentication" in str(res) and f"rank {r}:" in str(res)
        assert all(bad in pair for pair in res.pairs), res.pairs
        if r == bad:
            assert res.pairs == [tuple(sorted((bad, q))) for q in range(n) if q != bad]
        else:
            assert res.rank == bad and "with rank 1: it did not prove the job's secret" in str(res)
    if n == 3:
        assert "failed elsewhere in the group: ranks 1 and 2" in str(results[0])


def test_a_silent_peer_fails_the_others_within_the_timeout():
    pgs, listeners = gloo_world(3)
    vs = views(pgs, listeners)
    results = run_threads(3, lambda r: None if r == 2 else auth.authenticate_group(vs[r], SECRET, 1.0))
    for r in (0, 1):
        assert isinstance(results[r], auth.PairAuthError), results[r]
        assert (r, 2) in results[r].pairs and "with rank 2" in str(results[r])


def test_an_answer_is_bound_to_its_direction():
    v0 = auth.GroupView(None, (0, 1), 0, [])
    v1 = auth.GroupView(None, (0, 1), 1, [])
    sent0 = {1: os.urandom(16) + ends.pack_endpoints([], auth.CAPACITY)}
    sent1 = {0: os.urandom(16) + ends.pack_endpoints([], auth.CAPACITY)}
    ans0 = auth._answers(v0, SECRET, sent0, {1: sent1[0]})
    ans1 = auth._answers(v1, SECRET, sent1, {0: sent0[1]})
    failed: dict = {}
    auth._check_answers(v0, SECRET, sent0, {1: sent1[0]}, {1: ans1[0]}, failed)
    assert failed == {}
    auth._check_answers(v0, SECRET, sent0, {1: sent1[0]}, {1: ans0[1]}, failed)  # reflected back
    assert failed == {1: "it did not prove the job's secret"}
    failed.clear()
    tampered = ans1[0][:auth.MAC_BYTES] + ends.pack_endpoints([("10.0.0.9", 4)], auth.CAPACITY)
    auth._check_answers(v0, SECRET, sent0, {1: sent1[0]}, {1: tampered}, failed)
    assert 1 in failed


# ---- the guard's strategies ----------------------------------------------------------------------

def test_the_strategy_follows_the_job_secret(monkeypatch):
    monkeypatch.delenv("RINGLET_JOB_SECRET", raising=False)
    assert isinstance(guard.pair_guard(), guard.NoAuth)
    monkeypatch.setenv("RINGLET_JOB_SECRET", SECRET.hex())
    assert isinstance(guard.pair_guard(), guard.PairAuth)
    monkeypatch.setenv("RINGLET_JOB_SECRET", "abc")
    with pytest.raises(ValueError):
        guard.pair_guard()


def test_a_rank_outside_the_group_has_nothing_to_prove(monkeypatch):
    monkeypatch.setenv("RINGLET_JOB_SECRET", SECRET.hex())
    assert guard.secure_gloo(dist.GroupMember.NON_GROUP_MEMBER, set(), 1.0) is None
    assert guard.secure_gloo(None, set(), 1.0) is None


# ---- the stranger watch ----------------------------------------------------------------------------

@pytest.fixture
def listener():
    srv = socket.create_server(("127.0.0.1", 0))
    yield srv
    srv.close()


def _inode(sock) -> int:
    return int(os.readlink(f"/proc/self/fd/{sock.fileno()}")[8:-1])


def test_strangers_are_reported_once_and_refused_peers_are_kept(listener, monkeypatch):
    strangers.reset()
    logged = []
    monkeypatch.setattr("ringlet.transport._gloo_watch.note_stranger", lambda *a: logged.append(a) or True)
    peer = socket.create_connection(listener.getsockname())
    peer_srv, _ = listener.accept()
    stranger = socket.create_connection(listener.getsockname())
    stranger_srv, _ = listener.accept()  # accepted, as Gloo accepts everything
    watch = StrangerWatch()
    watch.add({_inode(listener): ends.canonical(listener.getsockname())}, {ends.canonical(peer.getsockname())})
    assert watch.check() == [ends.canonical(stranger.getsockname())]
    assert logged and logged[0][0] == "transport" and logged[0][1] == ends.canonical(stranger.getsockname())
    stranger.settimeout(5)
    assert stranger.recv(16) == b""          # refused: shut down by the watch
    assert watch.check() == []               # reported once
    peer.sendall(b"ok")
    assert peer_srv.recv(2) == b"ok"         # the peer's connection is untouched
    for s in (peer, peer_srv, stranger, stranger_srv):
        s.close()


def test_the_table_is_read_again_only_when_a_socket_comes(listener, monkeypatch):
    """The kernel's TCP table costs milliseconds: a check while this process's sockets stay the same
    does not read it; a stranger accepted later is a new socket, found by the next check."""
    strangers.reset()
    monkeypatch.setattr("ringlet.transport._gloo_watch.note_stranger", lambda *a: True)
    reads = []
    table = ends.tcp_table
    monkeypatch.setattr(ends, "tcp_table", lambda inodes=None: reads.append(1) or table(inodes))
    watch = StrangerWatch()
    watch.add({_inode(listener): ends.canonical(listener.getsockname())}, set())
    assert watch.check() == [] and len(reads) == 1
    assert watch.check() == [] and len(reads) == 1
    stranger = socket.create_connection(listener.getsockname())
    stranger_srv, _ = listener.accept()
    assert watch.check() == [ends.canonical(stranger.getsockname())] and len(reads) == 2
    for s in (stranger, stranger_srv):
        s.close()


def test_a_destroyed_group_is_no_longer_watched(listener):
    watch = StrangerWatch()
    watch.add({_inode(listener): ends.canonical(listener.getsockname())}, set())
    assert watch.watched() == [ends.canonical(listener.getsockname())]
    listener.close()
    assert watch.check() == [] and watch.watched() == []


# ---- endpoints ---------------------------------------------------------------------------------------

def test_endpoint_tables_round_trip():
    eps = [("127.0.0.1", 1), ("::1", 65535), ("192.0.2.2", 29500), ("fd00::2", 80)]
    raw = ends.pack_endpoints(eps, 4)
    assert len(raw) == ends.packed_size(4)
    assert ends.unpack_endpoints(raw, 4) == (eps, True)
    assert ends.unpack_endpoints(ends.pack_endpoints([], 4), 4) == ([], True)
    got, complete = ends.unpack_endpoints(ends.pack_endpoints(eps + [("10.0.0.1", 2)], 4), 4)
    assert got == eps and not complete
    assert ends.canonical(("::ffff:10.1.2.3", 5)) == ("10.1.2.3", 5)


def test_the_tcp_table_lists_this_process_sockets(listener):
    rows = {c.inode: (c, fd) for c, fd in ends.own_connections()}
    c, fd = rows[_inode(listener)]
    assert c.state == ends.LISTEN and fd == listener.fileno()
    assert c.local == ends.canonical(listener.getsockname())


# ---- the interface ------------------------------------------------------------------------------------

def _non_loopback_address():
    for _, name in socket.if_nameindex():
        addr = bind._ipv4_of(name)
        if addr and not addr.startswith("127."):
            return addr, name
    return None


def test_the_interface_follows_the_job_layout():
    lo = bind.interface_of("127.0.0.1")
    assert lo is not None
    assert bind.choose_interface({"MASTER_ADDR": "127.0.0.1"}) == lo
    assert bind.choose_interface({"MASTER_ADDR": "localhost"}) == lo
    assert bind.choose_interface({"MASTER_ADDR": "192.0.2.77", "RINGLET_RUN_HOSTS": "nodeA:4"}) == lo
    assert bind.choose_interface({"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "eth7"}) is None
    assert bind.choose_interface({}) is None
    assert bind.interface_of("not an address") is None
    other = _non_loopback_address()
    if other is not None:
        assert bind.choose_interface({"MASTER_ADDR": other[0], "RINGLET_RUN_HOSTS": "a:1,b:1"}) == other[1]


def _listener_of_new_group(environ):
    before = set(ends.socket_inodes())
    with bind.gloo_bound(environ):
        pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=10))
    eps = list(guard.new_listeners(before).values())
    del pg
    return eps


def test_gloo_listens_on_the_chosen_interface(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    eps = _listener_of_new_group({"MASTER_ADDR": "127.0.0.1"})
    assert eps and all(ep[0] in ("127.0.0.1", "::1") for ep in eps), eps
    assert "GLOO_SOCKET_IFNAME" not in os.environ  # restored
    other = _non_loopback_address()
    if other is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    eps = _listener_of_new_group({"MASTER_ADDR": other[0], "RINGLET_RUN_HOSTS": "a:1,b:1"})
    assert eps and all(ep[0] == other[0] for ep in eps), eps

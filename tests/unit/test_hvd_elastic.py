"""``ringlet.torch.elastic`` in-process: state commit/restore/sync, reset callbacks, the agreed host-update
check, the ``run`` loop (elastic mode simulated on ranks as threads) and ``ElasticSampler`` partitioning.
Real processes, a real driver and real deaths: tests/multiproc/test_elastic.py."""
from __future__ import annotations

import contextlib
import socket
import threading

import pytest
import torch
from hvd_world import hvd_world
from torch import nn

import ringlet.torch as hvd
from ringlet.elastic import protocol, release, rendezvous
from ringlet.torch import basics


@pytest.fixture
def hvd1():
    hvd.init()
    yield
    hvd.shutdown()


@contextlib.contextmanager
def placed(monkeypatch, rank: int, size: int):
    """Make the sampler see ``rank`` of ``size`` without a real world."""
    with monkeypatch.context() as m:
        m.setattr(basics, "is_initialized", lambda: True)
        m.setattr(basics, "size", lambda: size)
        m.setattr(basics, "rank", lambda: rank)
        yield


def test_exports():
    for name in ("run", "State", "ObjectState", "TorchState", "ElasticSampler", "HostsUpdatedInterrupt"):
        assert hasattr(hvd.elastic, name)
    assert issubclass(hvd.elastic.HostsUpdatedInterrupt, RuntimeError)


# ---- state ------------------------------------------------------------------------------------------
def test_object_state_commit_and_restore_are_deep_copies(hvd1):
    s = hvd.elastic.ObjectState(epoch=0, history=[1])
    s.epoch, s.history = 3, s.history + [2]
    s.commit()
    s.history.append(99)  # mutating the live value must not change the commit
    s.epoch = 7
    s.restore()
    assert s.epoch == 3 and s.history == [1, 2]
    s.history.append(5)
    s.restore()
    assert s.history == [1, 2]


def test_torch_state_restores_model_optimizer_sampler_and_values(hvd1):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, sampler=sampler, epoch=1, batch=0)
    assert state.model is model and state.optimizer is opt and state.sampler is sampler and state.epoch == 1

    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    sampler.record_indices([0, 1])
    state.batch = 4
    state.commit()
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = opt.state_dict()["state"][0]["momentum_buffer"].clone()

    opt.zero_grad()
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    sampler.record_indices([2, 3])
    state.batch, state.epoch = 9, 2
    state.restore()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in committed.items())
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], momentum)
    assert sampler.processed_indices == {0, 1} and sampler.indices == list(range(2, 10))
    assert (state.batch, state.epoch) == (4, 1)


def test_assigning_a_tracked_object_replaces_it(hvd1):
    state = hvd.elastic.TorchState(model=nn.Linear(2, 2))
    other = nn.Linear(2, 2)
    state.model = other
    with torch.no_grad():
        other.weight.fill_(3.0)
    state.commit()
    with torch.no_grad():
        other.weight.fill_(0.0)
    state.restore()
    assert state.model is other and torch.all(other.weight == 3.0)


def test_reset_callbacks_run_in_order_after_reset(hvd1):
    calls = []
    state = hvd.elastic.ObjectState(x=1)
    state.register_reset_callbacks([lambda: calls.append("a")])
    state.register_reset_callbacks([lambda: calls.append("b"), lambda: calls.append("c")])
    state.on_reset()
    assert calls == ["a", "b", "c"]


def test_sync_takes_rank0_commit_and_the_union_of_processed_indices():
    def body(r):
        torch.manual_seed(r)  # different weights on every rank
        model = nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1))
        sampler = hvd.elastic.ElasticSampler(list(range(12)), shuffle=False)
        sampler.record_indices([r])  # known to this rank only
        state = hvd.elastic.TorchState(model=model, optimizer=opt, sampler=sampler, epoch=10 + r, tag=f"r{r}")
        state.sync()
        return ({k: v.clone() for k, v in model.state_dict().items()}, opt.param_groups[0]["lr"],
                sampler.processed_indices, state.epoch, state.tag, sampler.indices)

    out = hvd_world(3, body)
    for params, lr, done, epoch, tag, indices in out:
        assert all(torch.equal(params[k], out[0][0][k]) for k in params)
        assert lr == pytest.approx(0.1) and done == {0, 1, 2} and epoch == 10 and tag == "r0"
    # The rest of the epoch (9 samples) is split over the 3 ranks without overlap.
    assert sorted(i for o in out for i in o[5]) == list(range(3, 12))


@pytest.mark.parametrize("pending", [True, False])
def test_check_host_updates_is_decided_by_rank0_and_raised_everywhere(monkeypatch, pending):
    asked = []
    monkeypatch.setattr(rendezvous, "enabled", lambda: True)
    monkeypatch.setattr(rendezvous, "hosts_updated", lambda: asked.append(hvd.rank()) or pending)

    def body(r):
        state = hvd.elastic.ObjectState(step=r)
        try:
            state.commit()
        except hvd.elastic.HostsUpdatedInterrupt as exc:
            return ("interrupt", exc.skip_sync)
        return ("ok", None)

    out = hvd_world(3, body)
    assert asked == [0]  # only rank 0 asks the driver; the others follow its broadcast answer
    assert out == [("interrupt", False)] * 3 if pending else out == [("ok", None)] * 3


def test_check_host_updates_outside_elastic_is_local(hvd1):
    hvd.elastic.ObjectState(a=1).commit()  # no driver, no collective, no interrupt


# ---- run --------------------------------------------------------------------------------------------
def test_run_restores_reinitialises_resets_and_retries(monkeypatch):
    """Elastic mode on ranks as threads: the first attempt fails on every rank after moving past the
    commit; the retry starts from the commit, after a re-init and the reset callbacks."""
    monkeypatch.setattr(rendezvous, "enabled", lambda: True)
    lock = threading.Lock()
    inits = []
    real_init = basics.init

    def counting_init(*a, **k):
        with lock:
            inits.append(threading.get_ident())
        return real_init(*a, **k)

    monkeypatch.setattr(basics, "init", counting_init)

    def body(r):
        resets, attempts = [], []
        state = hvd.elastic.ObjectState(step=0, owner=r)
        state.register_reset_callbacks([lambda: resets.append(hvd.size())])

        @hvd.elastic.run
        def train(state, stop_at):
            attempts.append((state.step, state.owner))
            while state.step < stop_at:
                state.step += 1
                if state.step == 2:
                    state.commit()
                if state.step == 3 and len(attempts) == 1:
                    raise hvd.HorovodInternalError("peer rank 2 died (simulated)")
            return state.step

        return train(state, 5), attempts, resets, hvd.is_initialized()

    for result, attempts, resets, initialised in hvd_world(2, body):
        # 1st attempt synced rank 0's initial value (owner 0); the retry resumed from the commit at step 2.
        assert result == 5 and attempts == [(0, 0), (2, 0)] and resets == [2] and initialised
    assert len(inits) == 2  # one re-init per rank


def test_run_host_update_reinitialises_without_restoring(monkeypatch):
    monkeypatch.setattr(rendezvous, "enabled", lambda: True)
    pending = {"n": 1}
    monkeypatch.setattr(rendezvous, "hosts_updated", lambda: pending.__setitem__("n", pending["n"] - 1) or
                        pending["n"] == 0)

    def body(r):
        attempts = []
        state = hvd.elastic.ObjectState(step=0)

        @hvd.elastic.run
        def train(state):
            attempts.append(state.step)
            while state.step < 4:
                state.step += 1
                state.commit()  # the first commit on rank 0 sees the update
            return state.step

        return train(state), attempts

    for result, attempts in hvd_world(2, body):
        assert result == 4 and attempts == [0, 1]  # resumed from the commit that raised, not restored


def test_run_outside_elastic_syncs_once_and_propagates_errors(hvd1):
    state = hvd.elastic.ObjectState(n=0)
    calls = []

    @hvd.elastic.run
    def ok(state, x, y=1):
        calls.append(x + y)
        return "done"

    assert ok(state, 2, y=3) == "done" and calls == [5]

    @hvd.elastic.run
    def broken(state):
        raise hvd.HorovodInternalError("boom")

    with pytest.raises(hvd.HorovodInternalError, match="boom"):
        broken(state)


# ---- sampler ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle", [True, False])
def test_sampler_partitions_the_epoch(monkeypatch, size, shuffle):
    n = 23
    shares = []
    for r in range(size):
        with placed(monkeypatch, r, size):
            s = hvd.elastic.ElasticSampler(list(range(n)), shuffle=shuffle, seed=5)
            s.set_epoch(1)
            shares.append(list(s))
            assert len(s) == -(-n // size) == len(shares[-1])
    flat = [i for sh in shares for i in sh]
    assert set(flat) == set(range(n)) and len(flat) - n < size  # padding only to a multiple of size
    if not shuffle:
        assert shares[0][:2] == [0, size]
    with placed(monkeypatch, 0, size):
        a = hvd.elastic.ElasticSampler(list(range(n)), shuffle=shuffle, seed=5)
        a.set_epoch(2)
    other_epoch = list(a)
    assert (other_epoch != shares[0]) == (shuffle and size < n)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_record_batch_is_the_same_on_every_rank(monkeypatch, size):
    n, bs, batches = 40, 3, 2
    recorded = []
    for r in range(size):
        with placed(monkeypatch, r, size):
            s = hvd.elastic.ElasticSampler(list(range(n)), shuffle=True, seed=1)
            mine = list(s)
            for b in range(batches):
                s.record_batch(b, bs)
                assert s.get_indices(b, bs) == mine[b * bs:(b + 1) * bs]
            recorded.append((s.processed_indices, set(mine[:batches * bs])))
    union_of_local = set().union(*(loc for _, loc in recorded))
    assert all(done == union_of_local for done, _ in recorded)
    assert len(union_of_local) == size * batches * bs


@pytest.mark.parametrize("before,after", [(3, 2), (2, 3), (4, 1), (1, 4), (3, 3)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_reset_resplits_the_rest_of_the_epoch(monkeypatch, before, after, shuffle):
    """k batches at ``before`` ranks, then the rest at ``after`` ranks: every sample exactly once (n is
    chosen so that no padding is needed) and the state travels through state_dict."""
    bs, k = 2, 3
    n = before * bs * k + after * 10
    processed = []
    state = None
    for r in range(before):
        with placed(monkeypatch, r, before):
            s = hvd.elastic.ElasticSampler(list(range(n)), shuffle=shuffle, seed=3)
            s.set_epoch(4)
            processed += list(s)[:k * bs]
            for b in range(k):
                s.record_batch(b, bs)
            state = s.state_dict()
    assert state["epoch"] == 4 and len(state["processed_indices"]) == before * bs * k
    for r in range(after):
        with placed(monkeypatch, r, after):
            s = hvd.elastic.ElasticSampler(list(range(n)), shuffle=shuffle, seed=3)
            s.load_state_dict(state)
            assert len(s) == 10
            processed += list(s)
    assert sorted(processed) == list(range(n))


def test_sampler_resets_to_the_current_world(monkeypatch):
    with placed(monkeypatch, 1, 3):
        s = hvd.elastic.ElasticSampler(list(range(9)), shuffle=False)
    assert list(s) == [1, 4, 7]
    with placed(monkeypatch, 0, 2):
        s.reset()
    assert list(s) == [0, 2, 4, 6, 8] and len(s) == 5
    with placed(monkeypatch, 0, 2):
        s.set_epoch(1)
        s.record_indices(range(9))
        s.reset()
    assert list(s) == [] and len(s) == 0


# ---- protocol ---------------------------------------------------------------------------------------
def test_assignment_follows_horovod_definitions():
    rec = protocol.Record(5, ("7", "3", "9", "4"), ("a", "a", "b", "b"))
    a = protocol.assignment(rec, "9")
    assert (a.generation, a.rank, a.size, a.local_rank, a.local_size, a.cross_rank, a.cross_size) == \
        (5, 2, 4, 0, 2, 1, 2)
    assert protocol.Record.decode(rec.encode()) == rec
    with pytest.raises(ValueError, match="not a member"):
        protocol.assignment(rec, "1")


# ---- releasing an obsolete generation -----------------------------------------------------------------
def _tcp_pair():
    lst = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(lst.getsockname())
    b, _ = lst.accept()
    lst.close()
    return a, b


def test_shutdown_sockets_touches_only_new_connections_and_never_the_store():
    old_a, old_b = _tcp_pair()
    before = release.socket_inodes()
    new_a, new_b = _tcp_pair()
    store_lst = socket.create_server(("127.0.0.1", 0))
    store_client = socket.create_connection(store_lst.getsockname())
    store_srv, _ = store_lst.accept()
    try:
        n = release.shutdown_sockets(before, keep_port=store_lst.getsockname()[1])
        # new_a and new_b (both ends live in this process) and the accepted store end (its peer port is
        # the client's ephemeral one, not the store's) - but not the client's connection to the store.
        assert n == 3
        new_b.settimeout(5)
        assert new_b.recv(1) == b""  # the peer sees the connection closed at once
        store_client.sendall(b"x")
        old_a.sendall(b"y")
        old_b.settimeout(5)
        assert old_b.recv(1) == b"y"
    finally:
        for s in (old_a, old_b, new_a, new_b, store_lst, store_client, store_srv):
            s.close()


def test_watchdog_tears_down_a_generation_the_driver_left(monkeypatch):
    import torch.distributed as dist

    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv(protocol.ENV_ADDR, "127.0.0.1")
    monkeypatch.setenv(protocol.ENV_PORT, str(master.port))
    monkeypatch.setattr(rendezvous, "RELEASE_GRACE", 0.2)
    master.set(protocol.GEN, "4")
    before = release.socket_inodes()
    a, b = _tcp_pair()
    me = protocol.Assignment(0, 2, 0, 2, 0, 1, "h", generation=4)
    monkeypatch.setattr(rendezvous, "_current", me)
    monkeypatch.setattr(rendezvous, "_snapshot", before)
    monkeypatch.setattr(rendezvous, "_stop_watch", threading.Event())
    t = threading.Thread(target=rendezvous._watch, daemon=True)
    t.start()
    try:
        b.settimeout(0.8)
        with pytest.raises(TimeoutError):
            b.recv(1)  # generation 4 is current: nothing happens
        master.set(protocol.GEN, "5")  # the driver moved on while this worker is still in 4
        b.settimeout(10)
        assert b.recv(1) == b""
        assert rendezvous._released == 4
    finally:
        rendezvous._stop_watch.set()
        t.join(5)
        monkeypatch.setattr(rendezvous, "_released", -1)
        a.close()
        b.close()

"""ringlet.ray's parts that need no Ray: settings, rank order and environment, the death record the driver
publishes, the error a failed run raises (over a stand-in for ``ray``), and detect() adopting a default
group made without torchrun's variables (Ray Train's ``tcp://`` init). The Ray runs are in tests/ray_jobs."""
from __future__ import annotations

import types

import pytest

from ringlet.liveness import keys as K
from ringlet.liveness.verdict import Verdict
from ringlet.ray import RayExecutor, RaySettings
from ringlet.ray.job import JobStore, rank_order
from ringlet.ray.results import Gather
from ringlet.store.torch_store import connect
from ringlet.types import PeerError


def test_settings_and_arguments_are_checked():
    s = RayExecutor.create_settings(timeout_s=5, nics={"eth0"}, collective_timeout_s=30)
    assert s.worker_env() == {"GLOO_SOCKET_IFNAME": "eth0", "RINGLET_TIMEOUT": "30"}
    for bad in ({"timeout_s": 0}, {"nics": set()}, {"collective_timeout_s": -1}, {"ssh_str": "ssh"}):
        with pytest.raises(ValueError):
            RayExecutor.create_settings(**bad)
    for kw, err in (({"num_workers": 0}, ValueError), ({"num_workers": 2, "cpus_per_worker": 0}, ValueError),
                    ({"num_workers": 2, "gpus_per_worker": 1}, ValueError),
                    ({"num_workers": 2, "num_hosts": 2}, NotImplementedError),
                    ({"num_workers": 2, "colour": "red"}, TypeError)):
        with pytest.raises(err):
            RayExecutor(RaySettings(), **kw)
    with pytest.raises(RuntimeError, match="start"):
        RayExecutor(num_workers=1).run(print)


def test_ranks_of_a_node_are_consecutive_and_the_env_describes_them():
    infos = [{"node_id": n, "ip": ip} for n, ip in (("a", "10.0.0.1"), ("b", "10.0.0.2"), ("a", "10.0.0.1"),
                                                     ("c", "10.0.0.2"))]
    order, hosts = rank_order(infos)
    assert order == [0, 2, 1, 3]
    assert hosts == [("10.0.0.1", 2), ("10.0.0.2", 1), ("10.0.0.2#2", 1)]
    store = JobStore("127.0.0.1")
    try:
        env = store.env(2, hosts)
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("2", "4", "0", "1")
        assert (env["HOROVOD_RANK"], env["HOROVOD_CROSS_RANK"], env["RINGLET_HOSTNAME"]) == ("2", "1", "10.0.0.2")
        assert env["MASTER_PORT"] == str(store.port) and len(env["RINGLET_JOB_SECRET"]) == 64
        store.record_failure(1, "10.0.0.1", "died")
        client = connect("127.0.0.1", store.port, environ={"RINGLET_JOB_SECRET": store.secret})
        job = K.job_prefix(env)
        assert client.get(K.dead_list(job)) == b"1,"
        v = Verdict.decode(client.get(K.of_rank(job, K.DEAD, 1)))
        assert (v.rank, v.host, v.kind) == (1, "10.0.0.1", "dead")
        with pytest.raises(Exception):  # the store refuses a client without the secret
            connect("127.0.0.1", store.port, timeout=2, connect_timeout=2, environ={}).get("x")
    finally:
        store.close()


class _TaskError(Exception):
    def __init__(self, cause):
        super().__init__(str(cause))
        self.cause = cause


class _ActorError(Exception):
    pass


def _fake_ray(outcomes: dict):
    """A stand-in for ``ray``: refs become ready one at a time in ``outcomes``' order; ``outcomes[ref]``:
    a value or an exception."""
    def get(ref):
        out = outcomes[ref]
        if isinstance(out, BaseException):
            raise out
        return out

    exc = types.SimpleNamespace(RayTaskError=_TaskError, RayActorError=_ActorError)
    def wait(refs, num_returns, timeout):
        first = next(r for r in outcomes if r in refs)
        return [first], [r for r in refs if r != first]

    return types.SimpleNamespace(exceptions=exc, get=get, wait=wait)


@pytest.mark.parametrize("case", ["ok", "dead_then_peer", "dead_alone", "raised"])
def test_a_failed_run_raises_what_failed_first(case):
    told = []
    peer = PeerError("rank 0: rank 1 (host h1) was killed", rank=1, host="h1")
    outcomes = {"ok": {"r0": 1, "r1": 2},
                "dead_then_peer": {"r1": _ActorError("actor died"), "r0": _TaskError(peer)},
                "dead_alone": {"r1": _ActorError("actor died"), "r0": 7},
                "raised": {"r1": _TaskError(ValueError("bad input")), "r0": _TaskError(peer)}}[case]
    refs = ["r0", "r1"]
    hosts = ["h0", "h1"]
    gather = Gather(_fake_ray(outcomes), refs, hosts, 5.0, lambda *a: told.append(a))
    if case == "ok":
        assert gather.wait() == [1, 2] and not told
        return
    expected = ValueError if case == "raised" else PeerError
    with pytest.raises(expected) as info:
        gather.wait()
    if case == "raised":
        assert any("rank 1" in n for n in info.value.__notes__)
    else:
        assert info.value.rank == 1 and "rank 1" in str(info.value)
    assert told and told[0][:2] == (1, "h1")  # the others were told of rank 1, not of a PeerError


def test_detect_adopts_a_default_group_made_without_torchrun_variables(monkeypatch):
    import torch.distributed as dist

    from ringlet.transport import detect

    for k in ("RINGLET_TRANSPORT", "WORLD_SIZE", "RANK", "MASTER_ADDR", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert detect() == "single"
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    assert detect() == "torch"

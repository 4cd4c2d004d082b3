"""The bounded env:// rendezvous (transport/_env_join.py) with ranks as threads over a real TCPStore, and
which agent store a rank opens (store/torch_store.py): ringlet's under ``ringlet run`` and srun, torch's
under torchrun even when the pods carry a job secret."""
from __future__ import annotations

import socket
import threading

import pytest

from ringlet.launch.config import RunConfig
from ringlet.launch.env import worker_env
from ringlet.store.torch_store import agent_store_authenticated
from ringlet.transport._env_join import env_rendezvous, read_env
from ringlet.types import PeerError, RingletError

SECRET = "ab" * 32


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank, world, port, addr="127.0.0.1"):
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": addr, "MASTER_PORT": str(port)}


def _join(ranks, world, timeout=1.0, generation=0):
    """Run env_rendezvous for each entry of ``ranks`` (rank 0 first) in threads: results or exceptions."""
    port = _port()
    out: list = [None] * len(ranks)

    def one(i, r):
        try:
            store, rank, size = env_rendezvous(timeout, generation, _env(r, world, port))
            out[i] = (rank, size, store)
        except Exception as exc:  # noqa: BLE001 - returned to the test
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i, r)) for i, r in enumerate(ranks)]
    threads[0].start()
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(30)
    return out


@pytest.mark.parametrize("env,message", [
    ({"WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK is not set"),
    ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK='x' is not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, r"RANK=2 is outside 0\.\.1"),
    ({"RANK": "0", "WORLD_SIZE": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "WORLD_SIZE=0 must be at least 1"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": " ", "MASTER_PORT": "1"}, "MASTER_ADDR is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP"),
])
def test_bad_variables_are_named(env, message):
    with pytest.raises(ValueError, match=message):
        read_env(env)


def test_every_rank_arrives():
    out = _join([0, 1, 2], 3)
    assert [(r, s) for r, s, _ in out] == [(0, 3), (1, 3), (2, 3)]
    assert out[1][2].add("probe", 1) == 1 and out[2][2].add("probe", 1) == 2  # one store for all


def test_a_missing_rank_fails_every_present_rank_naming_it():
    out = _join([0, 1, 3], 5, timeout=1.0)
    for got in out:
        assert isinstance(got, RingletError), got
        assert "3 of WORLD_SIZE=5 ranks arrived within 1s (RINGLET_TIMEOUT); missing RANK 2, 4." in str(got)


def test_a_duplicate_rank_fails_every_rank():
    out = _join([0, 1, 1], 3, timeout=5.0)
    for got in out:
        assert isinstance(got, RingletError) and "two processes have RANK=1" in str(got), got


def test_no_rendezvous_host_names_the_address():
    port = _port()
    with pytest.raises(PeerError, match=rf"rank 1: no env:// rendezvous at 127\.0\.0\.1:{port} .*RANK=0 running"):
        env_rendezvous(1.0, 0, _env(1, 2, port))


@pytest.mark.parametrize("env,authenticated", [
    ({}, False),                                                                   # no secret: torch's store
    ({"RINGLET_JOB_SECRET": SECRET}, True),                                        # a store ringlet hosts (srun)
    ({"RINGLET_JOB_SECRET": SECRET, "TORCHELASTIC_RUN_ID": "x"}, True),            # a store ringlet hosts (Ray)
    ({"RINGLET_JOB_SECRET": SECRET, "TORCHELASTIC_RUN_ID": "none", "ROLE_NAME": "default"}, False),  # torchrun
    ({"RINGLET_JOB_SECRET": SECRET, "ROLE_NAME": "ringlet", "RINGLET_AGENT_STORE": "ringlet"}, True),  # ringlet run
])
def test_which_agent_store(env, authenticated):
    assert agent_store_authenticated(env) is authenticated


def test_ringlet_run_marks_its_agent_store():
    assert worker_env(RunConfig(("true",), 2, "torch"), None)["RINGLET_AGENT_STORE"] == "ringlet"

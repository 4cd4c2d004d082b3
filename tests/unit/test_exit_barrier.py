"""The launcher's exit count-out (ringlet.launch.agent.exit_barrier_holding_store): node 0's agent, which hosts
the job's store, leaves only once every agent is out of torch's exit barrier, so none of them loses the
store while it still reads its release. Agents here are threads over a real TCPStore."""
from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import SimpleNamespace

from torch.distributed import TCPStore
from torch.distributed.elastic.utils import store as store_util

from ringlet.launch.agent import exit_barrier_holding_store


def make_agents(n: int):
    host = TCPStore("127.0.0.1", 0, n, True, timedelta(seconds=20), wait_for_workers=False)
    stores = [host] + [TCPStore("127.0.0.1", host.port, n, False, timedelta(seconds=20)) for _ in range(n - 1)]
    return [SimpleNamespace(_store=s, _worker_group=SimpleNamespace(group_rank=r, group_world_size=n))
            for r, s in enumerate(stores)]


def torch_barrier(agent):
    store_util.barrier(agent._store, agent._worker_group.group_world_size, key_prefix="test/exit",
                       barrier_timeout=20)


def test_node0_leaves_after_every_agent_has_left_the_barrier():
    n = 3
    agents = make_agents(n)
    released, left = {}, {}

    def run(rank):
        def barrier(agent):
            torch_barrier(agent)
            if rank == 2:
                time.sleep(0.5)  # slow to receive its release (a loaded host)
            released[rank] = time.monotonic()

        exit_barrier_holding_store(barrier)(agents[rank])
        left[rank] = time.monotonic()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(left) == list(range(n))
    assert left[0] >= released[2], (left, released)  # the store outlived the slow agent's release
    assert left[1] < released[2]  # the others do not wait


def test_node0_gives_up_after_the_timeout_and_store_errors_are_not_failures():
    agents = make_agents(2)  # agent 1 never counts out (its host died after the barrier)
    t0 = time.monotonic()
    exit_barrier_holding_store(lambda agent: None, timeout=0.3)(agents[0])
    assert 0.3 <= time.monotonic() - t0 < 5

    class Broken:
        def add(self, key, n):
            raise RuntimeError("store gone")

    agent = SimpleNamespace(_store=Broken(), _worker_group=SimpleNamespace(group_rank=0, group_world_size=2))
    exit_barrier_holding_store(lambda agent: None)(agent)  # returns: the job had succeeded

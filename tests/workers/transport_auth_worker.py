"""One rank of a job whose Gloo endpoints are probed (``RINGLET_JOB_SECRET`` set by the test):

    ringlet run -np N --transport torch -- python tests/workers/transport_auth_worker.py strangers OUT
    ringlet run -np N --transport torch -- python tests/workers/transport_auth_worker.py bad_secret OUT R

``strangers``: after ``ringlet.init()`` and a sub-group of ranks 0 and 1 (a second Gloo group), each rank
writes the Gloo listeners it watches to ``OUT.listeners<r>`` and waits for ``OUT.go`` (the test's
count of stranger connections per rank, made meanwhile). It calls the transport's ``check_strangers()``
until it has found that many, writes ``OUT.found<r>``, waits for ``OUT.finish`` (the test has checked
that every stranger was refused while the job runs), then checks all-reduces on the world and the
sub-group and a ``broadcast_object`` of the Horovod facade against their reference values.

``bad_secret``: rank R answers the Gloo pair challenge with another secret; every rank records the
error ``ringlet.init()`` raised and exits with status 3.

Each rank writes ``OUT.rank<r>`` (JSON).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

import ringlet

WAIT_S = 180.0  # bound on every wait for the test; the test's own job timeout ends a stuck job first


def wait_for(path: Path) -> str:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)
    return path.read_text()


def write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def find_strangers(transport, expected: int) -> list:
    found: list = []
    deadline = time.monotonic() + WAIT_S
    while len(found) < expected and time.monotonic() < deadline:
        found += transport.check_strangers()
        time.sleep(0.05)
    return found


def correct_results(rank: int, world: int, sub) -> dict:
    import ringlet.torch as hvd

    n = 13  # a prime element count
    total = ringlet.allreduce(torch.full((n,), float(rank + 1)), op=ringlet.SUM)
    checks = {"world_sum": bool(torch.all(total == world * (world + 1) / 2))}
    if rank in (0, 1):
        s = ringlet.allreduce(torch.full((n,), float(rank + 1)), op=ringlet.SUM, group=sub)
        checks["subgroup_sum"] = bool(torch.all(s == 3.0))
    hvd.init()
    try:
        checks["broadcast_object"] = hvd.broadcast_object({"from": rank, "payload": list(range(5))}, 0) == \
            {"from": 0, "payload": list(range(5))}
    finally:
        hvd.shutdown()
    return checks


def strangers(out: str) -> int:
    from ringlet.transport._gloo_watch import watch

    ringlet.init()
    rank, world = ringlet.rank(), ringlet.size()
    sub = ringlet.new_group([0, 1])
    write_json(Path(f"{out}.listeners{rank}"), watch.watched())
    expected = json.loads(wait_for(Path(f"{out}.go")))[str(rank)]
    transport = ringlet.collectives.runtime().transport
    found = find_strangers(transport, expected)
    write_json(Path(f"{out}.found{rank}"), found)
    wait_for(Path(f"{out}.finish"))
    summary = {"rank": rank, "expected": expected, "found": found, "checks": correct_results(rank, world, sub)}
    write_json(Path(f"{out}.rank{rank}"), summary)
    ringlet.shutdown()
    return 0


def bad_secret(out: str, bad: int) -> int:
    rank = int(os.environ["RANK"])
    if rank == bad:
        import ringlet.transport._gloo_guard as guard

        guard.job_secret = lambda environ=None: bytes(32)  # this rank holds another secret
    try:
        ringlet.init()
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        write_json(Path(f"{out}.rank{rank}"), {"rank": rank, "error": type(exc).__name__, "message": str(exc),
                                               "pairs": getattr(exc, "pairs", None),
                                               "peer_error": isinstance(exc, ringlet.PeerError)})
        return 3
    write_json(Path(f"{out}.rank{rank}"), {"rank": rank, "error": None})
    ringlet.shutdown()
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode, path = sys.argv[1], sys.argv[2]
    sys.exit(strangers(path) if mode == "strangers" else bad_secret(path, int(sys.argv[3])))

"""One rank of the real-process fuzz:

    ringlet run -np N --transport T -- python tests/workers/fuzz_worker.py OUT SEED FIRST COUNT

Every rank draws the same cases ``FIRST`` to ``FIRST + COUNT - 1`` from ``SEED`` (tests/workers/fuzz_cases.py and fuzz_hvd.py,
through ``random.Random``): core-API cases, and every third case one of the Horovod facade. Cases with
faults make some ranks differ on purpose (another shape, dtype, op, root, algorithm, name or collective,
a local argument error, sitting out). Each rank runs each case, judges its own outcome against the
reference (:func:`fuzz_run.judge`) and rewrites ``OUT.rank<r>`` after every case, so that a hang still
leaves the record of what ran. A case with faults runs on a group of its own (``ringlet.new_group``),
so that ranks it left out of step cannot disturb the next case; clean cases run on the world (and so
over the shm transport's mailbox). Between cases the ranks wait for each other through files
(:func:`settle`), so that a rank still timing out in one case does not make the others time out in the next.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch

from fuzz_cases import RandomDraw, draw_case
from fuzz_hvd import draw_hcase, hvd_judge, hvd_rank_body
from fuzz_run import judge, rank_body

import ringlet
import ringlet.torch as hvd


def run_case(i: int, seed: int, rank: int, world: int, partial: bool) -> dict:
    d = RandomDraw(seed * 100003 + i)
    if i % 3 == 2:
        case = draw_hcase(d, world)
        # Under use_runtime, hvd.init() takes the process's runtime without owning it: hvd.shutdown()
        # leaves it running for the next case.
        with ringlet.use_runtime(ringlet.init()):
            hvd.init()
            try:
                res = hvd_rank_body(case, rank)
            finally:
                hvd.shutdown()
        problems = hvd_judge(case, rank, res)
    else:
        case = draw_case(d, world, partial=partial)
        res = rank_body(case, rank, fresh_group=not case.clean)
        problems = judge(case, rank, res)
    kind = case.calls[case.members[0]].kind
    return {"i": i, "kind": kind, "clean": case.clean, "faults": list(case.faults), "status": res["status"],
            "error": res.get("error", "")[:400], "problems": problems, "case": repr(case)[:1500]}


def settle(out: str, i: int, rank: int, world: int, limit: float = 120.0) -> None:
    """Wait, outside ringlet, until every rank finished case ``i``: a rank that timed out in a case
    arrives later than the others, and must not make them time out in the next one."""
    open(f"{out}.done{i}.rank{rank}", "w").close()
    deadline = time.monotonic() + limit
    while not all(os.path.exists(f"{out}.done{i}.rank{r}") for r in range(world)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank {rank}: the other ranks did not finish case {i} within {limit} s")
        time.sleep(0.01)


def main() -> int:
    out, seed, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    ringlet.init()
    rank, world = ringlet.rank(), ringlet.size()
    # Over Gloo a timed-out receive closes the connection for good: no core case may leave a rank
    # waiting (faults hit every member or none; nobody sits out).
    partial = ringlet.init().transport.name != "torch"
    summary = {"rank": rank, "world": world, "seed": seed, "cases": [], "done": False}
    for i in range(first, first + count):
        t0 = time.monotonic()
        try:
            rec = run_case(i, seed, rank, world, partial)
        except Exception as exc:  # noqa: BLE001 - the harness itself failed: recorded as a problem
            rec = {"i": i, "problems": [f"harness: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"]}
        rec["seconds"] = round(time.monotonic() - t0, 3)
        summary["cases"].append(rec)
        with open(f"{out}.rank{rank}", "w") as f:
            json.dump(summary, f, indent=1)
        settle(out, i, rank, world)
    summary["done"] = True
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(summary, f, indent=1)
    ringlet.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

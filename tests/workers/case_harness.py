"""What the mixed-precision and local-SGD workers share: run named cases in order on every rank, record
each one's outcome in ``OUT.rank<r>`` (rewritten after every case, so a hang still leaves the record of
what passed), and compare state across ranks bitwise.

:func:`check` does not raise: a failed check is recorded and the case goes on, so a check that fails on
one rank only does not leave the others waiting in a collective; the case fails at its end."""
from __future__ import annotations

import json
import sys
import traceback
from typing import Callable

import torch

import ringlet


_failed: list[str] = []


def check(cond: bool, msg: str) -> None:
    if not cond:
        _failed.append(msg)


def flat(tensors) -> torch.Tensor:
    """The tensors as one float64 row (exact for float16/bfloat16/float32 and small integers)."""
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])


def identical_across_ranks(tensors) -> bool:
    """True when every rank holds bitwise the same values (one all-gather of a float64 row)."""
    rows = ringlet.allgather(flat(tensors).unsqueeze(0))
    return all(torch.equal(rows[0], row) for row in rows[1:])


def model_state(module: torch.nn.Module) -> list[torch.Tensor]:
    return list(module.parameters()) + list(module.buffers())


def run_cases(cases: list[tuple[str, Callable[[dict], None]]], out: str, rank: int, world: int,
              only: list[str] | None = None) -> None:
    summary = {"rank": rank, "world": world, "passed": [], "failed": [], "numbers": {}}
    for name, fn in cases:
        if only and name not in only:
            continue
        _failed.clear()
        try:
            fn(summary["numbers"])
            if _failed:
                raise AssertionError("; ".join(_failed))
            summary["passed"].append(name)
        except Exception as exc:  # noqa: BLE001 - recorded per case; the test prints it
            summary["failed"].append({"case": name, "error": f"{type(exc).__name__}: {exc}",
                                      "trace": traceback.format_exc()[-3000:]})
        with open(f"{out}.rank{rank}", "w") as f:
            json.dump(summary, f, indent=1)


def worker_main(make_cases: Callable[[int, int], list[tuple[str, Callable[[dict], None]]]]) -> int:
    """A worker process's main (``argv``: OUT [CASE,CASE,...]): ``ringlet.init()``, the cases
    ``make_cases(rank, world)`` through :func:`run_cases`, then ``ringlet.torch`` and ringlet shut down."""
    out = sys.argv[1]
    torch.set_num_threads(1)
    ringlet.init()
    rank, world = ringlet.rank(), ringlet.size()
    run_cases(make_cases(rank, world), out, rank, world, sys.argv[2].split(",") if len(sys.argv) > 2 else None)
    try:
        import ringlet.torch as hvd

        hvd.shutdown()
    finally:
        ringlet.shutdown()
    return 0

"""One rank of a job started the way a Kubernetes pod starts it (tests/multiproc/test_kubernetes_env.py):
the pod's command from docs/kubernetes/*.yaml, with the environment its operator gives the pod.

It calls ``ringlet.init()`` with no arguments (ringlet follows the launcher), then checks:

- the world: ``EXPECT_WORLD`` ranks, transport ``EXPECT_TRANSPORT``, ``EXPECT_LOCAL`` ranks per pod;
- a sum all-reduce of every rank's ``rank + 1`` (float32 and int64) and an average;
- one step of ringlet's DistributedDataParallel: each rank trains on its own slice of a global batch,
  and the parameters must equal those of the same seeded model trained in one process on the whole
  batch (the mean loss of equal slices averages to the whole batch's mean loss).

Writes ``$RESULT_DIR/rank-<r>.json`` with the facts and the failed checks (empty when all passed).
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F

import ringlet
from ringlet.torch import DistributedDataParallel

B = 4    # rows per rank
LR = 0.1


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def global_batch(world: int):
    g = torch.Generator().manual_seed(1)
    return torch.randn(world * B, 5, generator=g), torch.randint(0, 3, (world * B,), generator=g)


def ddp_step(rank: int, world: int) -> float:
    """Largest difference between the DDP step's parameters and the one-process reference."""
    x, y = global_batch(world)
    ddp = DistributedDataParallel(model())
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    F.cross_entropy(ddp(x[rank * B:(rank + 1) * B]), y[rank * B:(rank + 1) * B]).backward()
    opt.step()
    ref = model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    F.cross_entropy(ref(x), y).backward()
    ref_opt.step()
    return max((a - b).abs().max().item() for a, b in zip(ddp.module.parameters(), ref.parameters()))


def check(rank: int, world: int) -> list[str]:
    failed = []
    expect = {"EXPECT_WORLD": world, "EXPECT_TRANSPORT": ringlet.collectives.runtime().transport.name,
              "EXPECT_LOCAL": ringlet.local_size()}
    for name, got in expect.items():
        want = os.environ.get(name)
        if want is not None and str(got) != want:
            failed.append(f"{name}: expected {want}, got {got}")
    total = world * (world + 1) // 2
    out = ringlet.allreduce(torch.full((1000,), float(rank + 1)), op="sum")
    if not torch.equal(out, torch.full((1000,), float(total))):
        failed.append(f"float sum all-reduce: {out[:3].tolist()} != {total}")
    ints = ringlet.allreduce(torch.full((7,), rank + 1, dtype=torch.int64), op="sum")
    if ints.tolist() != [total] * 7:
        failed.append(f"int64 sum all-reduce: {ints.tolist()}")
    avg = ringlet.allreduce(torch.full((3,), float(rank)), op="avg")
    if not torch.allclose(avg, torch.full((3,), (world - 1) / 2)):
        failed.append(f"average all-reduce: {avg.tolist()}")
    diff = ddp_step(rank, world)
    if diff > 1e-6:
        failed.append(f"DDP step differs from the one-process reference by {diff:g}")
    return failed


def main() -> None:
    ringlet.init()
    rank, world = ringlet.rank(), ringlet.size()
    failed = check(rank, world)
    facts = {"rank": rank, "world": world, "local_rank": ringlet.local_rank(), "local_size": ringlet.local_size(),
             "cross_size": ringlet.cross_size(), "transport": ringlet.collectives.runtime().transport.name,
             "failed": failed}
    ringlet.shutdown()
    with open(os.path.join(os.environ["RESULT_DIR"], f"rank-{rank}.json"), "w") as f:
        json.dump(facts, f)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

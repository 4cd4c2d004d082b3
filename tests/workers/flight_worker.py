"""Ranks that go wrong, for the flight recorder and the stall inspector (``flight_worker.py CASE OUT``):

- ``skip``: the pitfall of asymmetric control flow: rank 2 skips one all-reduce and works elsewhere for
  ``RINGLET_TEST_AWAY_S`` seconds (default 1) before it shuts down; ranks 0 and 1 wait, then fail, in
  their third;
- ``kind``: rank 2 broadcasts where ranks 0 and 1 all-reduce;
- ``shape``: rank 2 all-reduces 5 elements where ranks 0 and 1 all-reduce 4;
- ``die``: a DDP training loop in which rank 1 leaves (``os._exit``) in its third step.

Every rank leaves its flight record in RINGLET_FLIGHT_DIR; the tests read the launcher's verdict and run
``ringlet diagnose`` on them. Writes ``<out>.rank<R>``: the rank and how its last call ended; a rank whose
call failed then exits with status 1, so the job fails as a user's would."""
import json
import os
import sys
import time

import torch

import ringlet


def skip(rank: int) -> None:
    for _ in range(3 if rank < 2 else 2):
        ringlet.allreduce(torch.ones(4))  # the call rank 2 makes one time fewer
    if rank == 2:
        time.sleep(float(os.environ.get("RINGLET_TEST_AWAY_S", "1")))


def kind(rank: int) -> None:
    ringlet.allreduce(torch.ones(4))
    if rank == 2:
        ringlet.broadcast(torch.ones(4), 0)  # where the others all-reduce
    else:
        ringlet.allreduce(torch.ones(4))


def shape(rank: int) -> None:
    ringlet.allreduce(torch.ones(4))
    ringlet.allreduce(torch.ones(5 if rank == 2 else 4))  # rank 2's tensor has one element more


def die(rank: int) -> None:
    from ringlet.torch.training import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        if rank == 1 and step == 2:
            os._exit(3)  # like a crash: no flight record, no goodbye to the peers
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()


def main() -> int:
    case, out = sys.argv[1], sys.argv[2]
    ringlet.init()
    rank = ringlet.rank()
    outcome = "ok"
    try:
        {"skip": skip, "kind": kind, "shape": shape, "die": die}[case](rank)
    except ringlet.RingletError as exc:
        outcome = type(exc).__name__
    ringlet.shutdown()
    with open(f"{out}.rank{rank}", "w") as fh:
        json.dump({"rank": rank, "outcome": outcome}, fh)
    return 0 if outcome == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())

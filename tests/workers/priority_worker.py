"""One rank of the priority-scheduling job:

    ringlet run -np N --transport T -- python tests/workers/priority_worker.py OUT.json

The models and loops are those of tests/workers/prio_models.py. Cases, in order (the last initialises
``ringlet.torch``):

* ``sgd_momentum``, ``adam``: five steps of first-in-first-out DDP, of ``priority=Priority(200 bytes)``
  without and with ``overlap_optimizer``, and of whole-bucket pieces with the overlap: the overlap gives
  bit for bit the parameters of the same pieces without it, whole pieces bit for bit FIFO's, small pieces
  FIFO's within 1e-6 (another summation order), and every rank holds bitwise the same parameters;
* ``front_first``: with the communication thread held until backward returned, the pieces go out in
  descending priority (front layers first), on every rank in the same order;
* ``no_sync_and_eval``: accumulation over three micro-batches and eval-mode forwards between steps give
  FIFO's parameters and outputs (within 1e-6: small pieces);
* ``buffers``: a model with BatchNorm, buffers broadcast before every forward, gives FIFO's parameters
  and buffers bitwise;
* ``timeline``: an overlapped run traced to a per-rank file has piece spans and forward waits, and
  :func:`~ringlet.torch.training.forward_overlap.forward_overlap` reads its shares;
* ``coordinated``: with ``ringlet.torch`` initialised, ``priority=`` is accepted and overlapped pieces
  give FIFO's parameters within 1e-6 (the DDP's scheduler is its own choice, not global state).
"""
from __future__ import annotations

import sys
import threading

import torch
import torch.nn.functional as F
from case_harness import check, identical_across_ranks, model_state, worker_main

from prio_models import SMALL, data, make_model, make_optimizer, overlapped, train

from ringlet import timeline
from ringlet.torch.training import DistributedDataParallel, Priority
from ringlet.torch.training.forward_overlap import forward_overlap

TOL = 1e-6


def case_equivalence(rank: int, opt: str):
    def run(numbers):
        fifo, _, _ = train(rank, 5, opt=opt)
        prio, _, _ = train(rank, 5, opt=opt, partition=SMALL)
        over, _, ddp = train(rank, 5, opt=opt, partition=SMALL, overlap=True)
        whole, _, _ = train(rank, 5, opt=opt, partition=1 << 30, overlap=True)
        numbers[f"pieces_{opt}"] = len(ddp._launch.layout.pieces)
        numbers[f"prio_vs_fifo_{opt}"] = float((prio - fifo).abs().max())
        check(torch.equal(over, prio), f"{opt}: overlap changed the parameters by {(over - prio).abs().max()}")
        check(torch.equal(whole, fifo), f"{opt}: whole pieces differ from FIFO by {(whole - fifo).abs().max()}")
        check(numbers[f"prio_vs_fifo_{opt}"] <= TOL, f"{opt}: pieces differ from FIFO by more than {TOL}")
        check(identical_across_ranks([over]), f"{opt}: ranks disagree")
    return run


def case_front_first(rank: int):
    def run(numbers):
        net = make_model()
        ddp, opt = overlapped(net)
        for s in range(3):
            opt.zero_grad()
            x, y = data(rank, s)
            loss = F.mse_loss(ddp(x), y)
            gate = threading.Event()
            ddp._comm.submit(lambda: gate.wait(60))  # hold the queue: every piece is ready at the first slot
            loss.backward()
            opt.step()
            gate.set()
            ddp.synchronize()
            n = len(ddp._launch.layout.pieces)
            check(ddp._launch.round.order == list(reversed(range(n))), f"step {s}: order {ddp._launch.round.order}")
        numbers["front_first_pieces"] = n
    return run


def case_no_sync_and_eval(rank: int):
    def run(numbers):
        fifo, fifo_eval, _ = train(rank, 4, micro=3, eval_every=1)
        over, over_eval, _ = train(rank, 4, micro=3, eval_every=1, partition=SMALL, overlap=True)
        check(float((fifo - over).abs().max()) <= TOL, "accumulation: parameters differ from FIFO")
        check(all(float((a - b).abs().max()) <= TOL for a, b in zip(fifo_eval, over_eval)),
              "eval forwards differ from FIFO")
    return run


def bn_model() -> torch.nn.Module:
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def case_buffers(rank: int):
    def run(numbers):
        def trained(prio):
            net = bn_model()
            ddp = DistributedDataParallel(net, bucket_cap_mb=0.001, tune=False, priority=prio)
            opt = make_optimizer("adam", net.parameters())
            if prio is not None:
                ddp.overlap_optimizer(opt)
            for s in range(4):
                opt.zero_grad()
                x, y = data(rank, s)
                F.mse_loss(ddp(x), y).backward()
                opt.step()
            ddp.synchronize()
            return model_state(net)
        fifo, over = trained(None), trained(Priority(SMALL))
        check(all(torch.equal(a, b) for a, b in zip(fifo, over)), "parameters or buffers differ from FIFO")
        check(identical_across_ranks(list(over)[:len(list(bn_model().parameters()))]), "ranks disagree")
    return run


def case_timeline(rank: int, out: str):
    def run(numbers):
        path = f"{out}.timeline{rank}.json"
        timeline.start_timeline(f"{out}.timeline{{rank}}.json")  # {rank}: every rank writes its own
        try:
            train(rank, 6, partition=SMALL, overlap=True)
        finally:
            timeline.stop_timeline()
        f = forward_overlap(path, rank=rank, skip=1)
        check(f.comm_us > 0 and f.wait_us >= 0 and 0.0 <= f.share_forward <= 1.0, f"numbers {f}")
        events = timeline.read_events(path)
        names = {e.get("name") for e in events}
        check({"WAIT", "UPDATE", "COMMUNICATE", "NEGOTIATE"} <= names, f"phases {sorted(map(str, names))}")
        numbers[f"share_forward_{rank}"] = round(f.share_forward, 3)
    return run


def case_coordinated(rank: int):
    def run(numbers):
        import ringlet.torch as hvd

        hvd.init()
        ddp = DistributedDataParallel(make_model(), priority=Priority())
        check(not ddp._comm.coordinated and ddp.options.priority is not None, "priority= not in force")
        fifo, _, _ = train(rank, 3)
        over, _, ddp = train(rank, 3, partition=SMALL, overlap=True)
        check(len(ddp._launch.layout.pieces) > 1, "no pieces under ringlet.torch")
        check(float((over - fifo).abs().max()) <= TOL, f"pieces differ from FIFO by {(over - fifo).abs().max()}")
        check(identical_across_ranks([over]), "ranks disagree")
    return run


def make_cases(rank: int, world: int):
    return [("sgd_momentum", case_equivalence(rank, "sgd")), ("adam", case_equivalence(rank, "adam")),
            ("front_first", case_front_first(rank)), ("no_sync_and_eval", case_no_sync_and_eval(rank)),
            ("buffers", case_buffers(rank)), ("timeline", case_timeline(rank, sys.argv[1])),
            ("coordinated", case_coordinated(rank))]


if __name__ == "__main__":
    sys.exit(worker_main(make_cases))

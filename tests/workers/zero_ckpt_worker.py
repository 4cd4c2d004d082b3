"""One rank of a ZeRO checkpoint job, with the reference sharder of tests/workers/zero_fake.py:

    ringlet run -np N --transport T -- python tests/workers/zero_ckpt_worker.py OUT ACTION DIR

``first``: three steps of the unsharded model, sharded over N ranks, two steps, an asynchronous save of
``DIR/step-5`` while three more steps run, then a synchronous save of ``DIR/ref-8``;
``resume``: a fresh model sharded over this job's ranks loads ``DIR/step-5`` and runs the same three steps
from the step it records, then saves ``DIR/resumed-8`` (the test compares it with ``ref-8``);
``real_first`` / ``real_resume`` (extra arguments: the stage): the same with ``ringlet.torch.ZeroOptimizer``
(Adam) on a small MLP, each step's global batch of 12 rows split evenly over the ranks, so runs on any
world size average the same gradients (the test compares within 1e-6: summation orders differ);
``kill``: a synchronous save of ``DIR/good``, then an asynchronous save of ``DIR/bad`` through a slow
writer, and rank 1 kills itself with SIGKILL while its data file is being written.
``first`` and ``resume`` write ``OUT.rank<r>`` (case_harness summary); ``kill`` leaves only its files.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch
from case_harness import check, run_cases

from zero_ckpt_models import sharded

import ringlet
from ringlet.torch.training.zero import checkpoint as zckpt
from ringlet.torch.training.zero.checkpoint import AtomicWriter, SaveOptions


class SlowWriter(AtomicWriter):
    """Sleeps after every write call of a data file; ``started`` is set after its first one."""

    def __init__(self, pause: float):
        self.pause = pause
        self.started = threading.Event()

    def stream(self, f, final):
        if not final.name.endswith(".pt"):
            return f
        outer = self

        class Slow:
            def write(self, b):
                n = f.write(b)
                f.flush()
                outer.started.set()
                time.sleep(outer.pause)
                return n

            def flush(self):
                f.flush()
        return Slow()


def first(rank: int, world: int, folder: str):
    def run(numbers):
        net, zero = sharded(world, rank)
        for step in (3, 4):
            zero.step(step)
        handle = zckpt.save_async(f"{folder}/step-5", zero, net, extra={"step": 5})
        for step in (5, 6, 7):
            zero.step(step)
        handle.wait()
        sync = zckpt.save(f"{folder}/ref-8", zero, net, extra={"step": 8})
        numbers["async_stall_s"], numbers["sync_stall_s"] = handle.stall_seconds, sync.stall_seconds
    return run


def resume(rank: int, world: int, folder: str):
    def run(numbers):
        net, zero = sharded(world, rank, seed=7, steps=0)
        extra = zckpt.load(f"{folder}/step-5", zero, net)
        check(extra == {"step": 5}, f"extra {extra}")
        for step in range(extra["step"], 8):
            zero.step(step)
        zckpt.save(f"{folder}/resumed-8", zero, net, extra={"step": 8})
    return run


ROWS = 12  # divisible by 1, 2, 3, 4 and 6: every world size averages the same global batch


def _real(stage: int):
    from ringlet.torch.training.zero import ZeroOptimizer

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.Tanh(), torch.nn.Linear(13, 5))
    return net, ZeroOptimizer(torch.optim.Adam, net, stage=stage, lr=0.01)


def _real_step(net, zero, step: int, rank: int, world: int) -> None:
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(ROWS, 7, generator=g), torch.randn(ROWS, 5, generator=g)
    part = slice(rank * ROWS // world, (rank + 1) * ROWS // world)
    torch.nn.functional.mse_loss(net(x[part]), y[part]).backward()
    zero.step()
    zero.zero_grad()


def real_first(rank: int, world: int, folder: str, stage: int):
    def run(numbers):
        net, zero = _real(stage)
        for step in range(5):
            _real_step(net, zero, step, rank, world)
        handle = zckpt.save_async(f"{folder}/step-5", zero, net, extra={"step": 5})
        for step in (5, 6, 7):
            _real_step(net, zero, step, rank, world)
        handle.wait()
        zckpt.save(f"{folder}/ref-8", zero, net, extra={"step": 8})
    return run


def real_resume(rank: int, world: int, folder: str, stage: int):
    def run(numbers):
        net, zero = _real(stage)
        extra = zckpt.load(f"{folder}/step-5", zero, net)
        check(extra == {"step": 5}, f"extra {extra}")
        for step in range(extra["step"], 8):
            _real_step(net, zero, step, rank, world)
        zckpt.save(f"{folder}/resumed-8", zero, net, extra={"step": 8})
    return run


def kill(rank: int, world: int, folder: str):
    def run(numbers):
        net, zero = sharded(world, rank)
        zckpt.save(f"{folder}/good", zero, net, extra={"step": 3})
        writer = SlowWriter(pause=0.3)
        handle = zckpt.save_async(f"{folder}/bad", zero, net, options=SaveOptions(writer=writer))
        if rank == 1:
            check(writer.started.wait(60), "the slow write never started")
            os.kill(os.getpid(), signal.SIGKILL)
        handle.wait()
    return run


def main() -> int:
    out, action, folder = sys.argv[1:4]
    torch.set_num_threads(1)
    ringlet.init()
    rank, world = ringlet.rank(), ringlet.size()
    make = {"first": first, "resume": resume, "kill": kill}.get(action)
    if make is None:  # real_first / real_resume STAGE
        stage = int(sys.argv[4])
        make = {"real_first": real_first, "real_resume": real_resume}[action]
        make = (lambda fn: lambda r, w, f: fn(r, w, f, stage))(make)
    if action == "kill":
        make(rank, world, folder)({})
        os._exit(0)  # the peer is dead: no shutdown handshake
    run_cases([(action, make(rank, world, folder))], out, rank, world)
    ringlet.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Prototype: how much step time could deferring part of the optimizer update into the next forward save?

    ringlet run --cluster -np 4 -- python benchmarks/training_ddp/cross_step_overlap.py overlap 4 2
    ringlet run --cluster -np 4 -- python benchmarks/training_ddp/cross_step_overlap.py wait 4 2

The CNN of ``examples/synthetic_benchmark.py`` trained by hand with ringlet's core all-reduce (SGD, the
gradients averaged in two buckets, like DDP: the fully connected layers' 8.4 MB, then the convolutions').

- ``wait``: every bucket is reduced before the update; the fc bucket goes out in K pieces as soon as
  its gradients are in, the conv bucket at the end of backward. What DDP does.
- ``overlap``: only the first J pieces of the fc bucket go out during backward; the conv bucket goes
  next, then the rest of fc. The step waits for the conv bucket only and updates the convolutions; the
  fc update happens in a forward pre-hook of the first fc layer, so the next forward's convolutions
  run while the fc tail is on the wire (cross-iteration overlap, as in ByteScheduler). The order of the
  pieces is fixed, so every rank runs the same collectives in the same order. The math is synchronous
  SGD either way (the script checks that the ranks' parameters agree), but parameters are stale between
  ``step`` and the next forward.

The feature this prototype measured is now ringlet's DDP with ``priority=ringlet.torch.Priority(...)`` and
``ddp.overlap_optimizer(optimizer)`` (docs/training.md), paired against first-in-first-out by the
``ringlet:priority`` arms of ``benchmarks/training_ddp/paired_ddp.py``; this script stays as the record of the
hand-made measurement.

Prints img/s per rank (mean over ranks), CPU per step and wall per step of rank 0.
"""
from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn.functional as F

import ringlet
from ringlet.types import ReduceOp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import synthetic_benchmark


def flat_buffer(params):
    offsets, n = {}, 0
    for p in params:
        offsets[id(p)] = (n, p.numel())
        n += p.numel()
    return torch.zeros(n), offsets


def main() -> None:
    mode, k, j = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    algorithm = sys.argv[4] if len(sys.argv) > 4 else "auto"
    steps, warmup, lr = 25, 15, 0.01
    torch.set_num_threads(1)
    ringlet.init()
    torch.manual_seed(0)
    model = synthetic_benchmark.cnn()
    for p in model.parameters():
        ringlet.broadcast_(p.data, 0)
    params = list(model.parameters())
    conv, fc = params[:6], params[6:]
    fc_buf, fc_off = flat_buffer(fc)
    conv_buf, conv_off = flat_buffer(conv)
    pieces = list(torch.tensor_split(fc_buf, k))
    state = {"fc_left": 0, "conv_left": 0, "fc_work": [], "conv_work": None, "fc_pending": False}

    def launch_fc(indices):
        for i in indices:
            state["fc_work"].append(ringlet.allreduce_async_(pieces[i], op=ReduceOp.AVG, algorithm=algorithm))

    def on_grad(p):
        if id(p) in fc_off:
            o, n = fc_off[id(p)]
            fc_buf[o:o + n].copy_(p.grad.reshape(-1))
            state["fc_left"] -= 1
            if state["fc_left"] == 0:
                launch_fc(range(j) if mode == "overlap" else range(k))
        else:
            o, n = conv_off[id(p)]
            conv_buf[o:o + n].copy_(p.grad.reshape(-1))
            state["conv_left"] -= 1
            if state["conv_left"] == 0:
                state["conv_work"] = ringlet.allreduce_async_(conv_buf, op=ReduceOp.AVG, algorithm=algorithm)
                if mode == "overlap":
                    launch_fc(range(j, k))

    for p in params:
        p.register_post_accumulate_grad_hook(on_grad)

    @torch.no_grad()
    def update(ps, buf, offsets):
        for p in ps:
            o, n = offsets[id(p)]
            p.add_(buf[o:o + n].view_as(p), alpha=-lr)

    def finish_fc(*_):
        if state["fc_pending"]:
            for w in state["fc_work"]:
                w.wait()
            state["fc_work"] = []
            update(fc, fc_buf, fc_off)
            state["fc_pending"] = False

    model[10].register_forward_pre_hook(finish_fc)  # the first fully connected layer
    data, target = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))

    def step():
        for p in params:
            p.grad = None
        state["fc_left"], state["conv_left"] = len(fc), len(conv)
        F.cross_entropy(model(data), target).backward()
        state["conv_work"].wait()
        update(conv, conv_buf, conv_off)
        state["fc_pending"] = True
        if mode == "wait":
            finish_fc()

    for _ in range(warmup):
        step()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        step()
    finish_fc()
    wall = (time.perf_counter() - wall0) / steps
    rate = torch.tensor([32 / wall])
    ringlet.allreduce_(rate, op=ReduceOp.AVG)
    check = ringlet.allgather(torch.tensor([float(params[7].detach().sum())]))
    if ringlet.rank() == 0:
        print(f"{mode} K={k} J={j} img/s per rank: {rate.item():.1f}  CPU/step "
              f"{(time.process_time() - cpu0) / steps * 1e3:.1f} ms, wall {wall * 1e3:.1f} ms, "
              f"ranks agree: {bool((check == check[0]).all())}", flush=True)
    ringlet.shutdown()


if __name__ == "__main__":
    main()

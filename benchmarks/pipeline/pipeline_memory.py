"""Memory per rank of ``ringlet.torch.Pipeline``: parameters per stage and peak activations, 1F1B against GPipe.

    ringlet run -np 4 -- python benchmarks/pipeline/pipeline_memory.py --out benchmarks/pipeline/results/memory.json

One job builds, in turn, pipelines of 2 stages × 2 replicas and 4 stages × 1 over the same deep MLP as
``paired_pipeline.py`` (``--depth`` Linear+ReLU layers of ``--width``, then a Linear to 10 classes), each with
the 1F1B and the GPipe schedule and ``--microbatches`` micro-batches (global batch ``--batch-size``, so each
replica ``batch / R`` rows), and runs ``--steps`` SGD steps of each. Per rank it measures:

* **parameters held**: the elements and bytes of the stage's parameters (``pipe.parameters()``; the pipeline
  keeps only its stage's layers and the script drops the whole model), against the model's ``/ S``;
* **peak micro-batches held**: ``pipe.stats.peak_inflight``, the most micro-batches whose activations the
  stage held at once (1F1B: ``S - stage``; GPipe: ``M``);
* **peak activation bytes**: measured, not computed. Every tensor autograd saves for the backward during
  ``pipe.step`` passes through ``torch.autograd.graph.saved_tensors_hooks``: the pack hook notes its storage
  (tensors sharing a storage, such as a ReLU's output and the next Linear's input, count once; storages of
  parameters and of the first stage's input batch are left out: they are held whatever the schedule, and
  are not activations; the receive buffers of later stages count) and attaches a finaliser that fires when autograd drops
  the saved tensor (after that micro-batch's backward); the high-water mark of the live storages' bytes during
  the step is the stage's peak activation memory. After every step the live bytes must be back at zero (else
  the script stops: something kept activations alive). ``bytes per held micro-batch`` = peak bytes / peak held.

Rank 0 prints a table and, with ``--out``, writes every rank's numbers as JSON.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import weakref

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paired_pipeline import Batch, deep_mlp  # noqa: E402

import ringlet  # noqa: E402
import ringlet.torch  # noqa: E402

LAYOUTS = [(2, "1f1b"), (2, "gpipe"), (4, "1f1b"), (4, "gpipe")]


class SavedBytes:
    """The bytes of distinct storages autograd holds for the backward, live and at their peak, while
    :meth:`hooks` is active, leaving out those of ``params`` and ``inputs`` (see the module doc)."""

    def __init__(self, params, inputs=()) -> None:
        self._params = {t.untyped_storage().data_ptr() for t in [*params, *inputs]}
        self._refs: dict[int, int] = {}   # storage address -> saved tensors holding it
        self._bytes: dict[int, int] = {}  # storage address -> its bytes
        self._lock = threading.Lock()
        self.live = self.peak = 0

    def _pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self._params or storage.nbytes() == 0:
            return t
        holder = _Saved(t)
        with self._lock:
            if self._refs.get(key, 0) == 0:
                self._bytes[key] = storage.nbytes()
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
            self._refs[key] = self._refs.get(key, 0) + 1
        weakref.finalize(holder, self._drop, key)
        return holder

    def _drop(self, key: int) -> None:
        with self._lock:
            self._refs[key] -= 1
            if self._refs[key] == 0:
                del self._refs[key]
                self.live -= self._bytes.pop(key)

    @staticmethod
    def _unpack(x):
        return x.t if isinstance(x, _Saved) else x

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)


class _Saved:
    """A saved tensor as the pack hook hands it to autograd; its finaliser marks the tensor dropped."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def measure(args, stages: int, schedule: str, batch: Batch, total: int) -> dict:
    """One pipeline's numbers on this rank over ``args.steps`` steps (the peaks are the maxima over steps)."""
    torch.manual_seed(0)
    model = deep_mlp(args.depth, args.width)
    pipe = ringlet.torch.Pipeline(model, stages, args.microbatches, schedule, sufficient_factors=False)
    del model
    gc.collect()
    params = list(pipe.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    x, y = batch.part(pipe.replica, pipe.replicas)
    saved = SavedBytes(params, [x] if pipe.is_first else [])
    peak_bytes = peak_held = 0
    for _ in range(args.steps):
        opt.zero_grad()
        saved.peak = 0
        with saved.hooks():
            pipe.step(x if pipe.is_first else None, y if pipe.is_last else None, F.cross_entropy)
        opt.step()
        gc.collect()
        if saved.live:
            raise SystemExit(f"rank {ringlet.rank()}: {saved.live} bytes of saved activations still alive after a "
                             "step")
        peak_bytes, peak_held = max(peak_bytes, saved.peak), max(peak_held, pipe.stats.peak_inflight)
    n = sum(p.numel() for p in params)
    return {"stages": stages, "replicas": pipe.replicas, "schedule": schedule, "stage": pipe.stage,
            "replica": pipe.replica, "layers": list(pipe.layers), "parameters": n,
            "parameter_bytes": sum(p.numel() * p.element_size() for p in params), "share_of_model": n / total,
            "peak_inflight": peak_held, "peak_activation_bytes": peak_bytes,
            "bytes_per_microbatch": peak_bytes / peak_held if peak_held else 0.0,
            "microbatch_rows": batch.x.shape[0] // pipe.replicas // args.microbatches}


def print_table(rows: list[dict], total: int, args) -> None:
    print(f"deep MLP {args.depth} x {args.width}: {total} parameters ({total * 4 / 2**20:.1f} MiB fp32); global batch "
          f"{args.batch_size}, {args.microbatches} micro-batches; replica 0 of every stage")
    print("| S x R | schedule | stage | layers | parameters (share of model) | MiB | peak micro-batches held | "
          "peak activation KiB | KiB per held micro-batch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["replica"]:
            continue
        print(f"| {r['stages']} x {r['replicas']} | {r['schedule']} | {r['stage']} | {r['layers'][0]}-"
              f"{r['layers'][1] - 1} | {r['parameters']} ({r['share_of_model']:.3f}) | "
              f"{r['parameter_bytes'] / 2**20:.1f} | {r['peak_inflight']} | {r['peak_activation_bytes'] / 1024:.0f} | "
              f"{r['bytes_per_microbatch'] / 1024:.0f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=128, help="the global batch")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--out", default="", help="every rank's numbers as JSON (rank 0 writes)")
    args = p.parse_args()
    torch.set_num_threads(1)
    ringlet.init()
    if ringlet.size() != 4:
        raise SystemExit(f"run on 4 ranks (2 x 2 and 4 x 1), not {ringlet.size()}")
    batch = Batch(args.batch_size, args.width, 4)
    total = sum(q.numel() for q in deep_mlp(args.depth, args.width).parameters())
    mine = [measure(args, stages, schedule, batch, total) for stages, schedule in LAYOUTS]
    rows = _gather(mine)
    if ringlet.rank() == 0:
        rows.sort(key=lambda r: (r["stages"], r["schedule"] != "1f1b", r["stage"], r["replica"]))
        print_table(rows, total, args)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"argv": sys.argv[1:], "parameters": total, "rows": rows}, f, indent=1)
    ringlet.shutdown()


def _gather(mine: list[dict]) -> list[dict]:
    """Every rank's rows on every rank, through ringlet's all-gather of a JSON byte tensor."""
    data = torch.tensor(list(json.dumps(mine).encode()), dtype=torch.uint8)
    sizes = ringlet.allgather(torch.tensor([data.numel()])).tolist()
    padded = torch.zeros(max(sizes), dtype=torch.uint8)
    padded[:data.numel()] = data
    every = ringlet.allgather(padded.unsqueeze(0))
    return [r for k, n in enumerate(sizes) for r in json.loads(bytes(every[k, :n].tolist()).decode())]


if __name__ == "__main__":
    main()

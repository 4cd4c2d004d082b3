"""One sweep, run on every rank of a job: for each collective and size, time the out-of-place and
in-place forms of every implementation (their timing blocks interleaved, so the comparison is fair
on a noisy machine), then check every result element by element (nccl-tests' #wrong).

Data is integer-valued and generated from a closed form, so each rank computes the expected
result itself without materialising the other ranks' inputs (1 GiB rows stay within memory).

:func:`run_compression_sweep` measures ``spec.compressions`` (``ringlet bench --compression``): for
each size, the compressed all-reduces of every compressor timed interleaved, their bytes counted by the
transport, and their error against the exact sum.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

import ringlet
from ringlet.benchmarking import busbw, iterations_for, time_interleaved
from ringlet.engine.ops import scale_
from ringlet.types import ReduceOp, reduction

from . import impls


@dataclass(frozen=True)
class SweepSpec:
    """What to measure. ``sizes`` are bytes of the full buffer (all-gather: the output; reduce-
    scatter: the input), rounded down to whole elements divisible by the world size."""

    sizes: tuple[int, ...]
    collectives: tuple[str, ...] = ("allreduce",)
    implementations: tuple[str, ...] = ("ringlet:auto",)
    dtype: torch.dtype = torch.float32
    op: ReduceOp = ReduceOp.SUM
    warmup: int = 2
    iters: int = 0  # 0: fewer for big sizes (see iterations_for)
    inplace: bool = True
    compressions: tuple[str, ...] = ()  # run_compression_sweep's compressors, "none" first
    compression_algorithm: str = "ring"  # the compressed all-reduces' schedule (see impls.CompressedAllreduce)


@dataclass
class Row:
    collective: str
    impl: str
    size: int
    count: int
    dtype: str
    op: str
    oop_us: float = float("nan")
    oop_algbw: float = float("nan")
    oop_busbw: float = float("nan")
    oop_wrong: int = -1
    ip_us: float = float("nan")
    ip_algbw: float = float("nan")
    ip_busbw: float = float("nan")
    ip_wrong: int = -1
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class CompressionRow:
    """One compressor at one size (:func:`run_compression_sweep`). ``us``: median time per call of the
    slowest rank; ``algbw``: input bytes / time (GB/s); ``sent``: bytes this rank's transport sent per call
    (``WireCount.sent``), max over ranks, and ``sent_mean`` the mean over ranks; ``native``: bytes per call
    handed to the backend's own all-reduce (0 unless a schedule ran natively), max over ranks; ``ratio``:
    ``sent`` / the ``none`` row's ``sent``; ``max_err``: max abs difference from the float64 sum of the
    inputs, of one call with a fresh state."""

    size: int
    count: int
    dtype: str
    compressor: str
    us: float = float("nan")
    algbw: float = float("nan")
    sent: float = float("nan")
    sent_mean: float = float("nan")
    native: float = 0.0
    ratio: float = float("nan")
    max_err: float = float("nan")

    def as_dict(self) -> dict:
        return asdict(self)


def pattern(n: int, rank: int, dtype: torch.dtype, op: ReduceOp, offset: int = 0) -> torch.Tensor:
    """Integer data for ``rank``: exact in every dtype for sums of a few ranks; {−1, 1, 2} for products."""
    i = torch.arange(offset, offset + n, dtype=torch.int64) + 3 * rank
    if op == ReduceOp.PRODUCT:
        vals = torch.tensor([-1, 1, 2])[i % 3] if dtype != torch.uint8 else torch.tensor([1, 2, 1])[i % 3]
    elif dtype == torch.uint8:
        vals = i % 9
    else:
        vals = i % 9 - 4
    return vals.to(dtype)


def _fold(n: int, p: int, dtype, op: ReduceOp, offset: int = 0) -> torch.Tensor:
    acc = pattern(n, 0, dtype, op, offset)
    for r in range(1, p):
        reduction(op).combine(acc, pattern(n, r, dtype, op, offset))
    if op == ReduceOp.AVG:
        scale_(acc, 1.0 / p)
    return acc


def _case(collective: str, n: int, p: int, me: int, dtype, op):
    """(input, preallocated output or None, expected result) for this rank."""
    k = n // p
    if collective == "allreduce":
        return pattern(n, me, dtype, op), None, _fold(n, p, dtype, op)
    if collective == "broadcast":
        return pattern(n, me, dtype, op), None, pattern(n, 0, dtype, op)
    if collective == "allgather":
        exp = torch.cat([pattern(k, r, dtype, op) for r in range(p)])
        return pattern(k, me, dtype, op), torch.empty(n, dtype=dtype), exp
    if collective == "reduce_scatter":
        return pattern(n, me, dtype, op), torch.empty(k, dtype=dtype), _fold(k, p, dtype, op, offset=me * k)
    if collective == "alltoall":
        # rank s sends its chunk d to rank d: element j of that chunk is pattern(n, s)[d*k + j]
        exp = torch.cat([pattern(k, s, dtype, op, offset=me * k) for s in range(p)])
        return pattern(n, me, dtype, op), torch.empty(n, dtype=dtype), exp
    raise ValueError(f"unknown collective {collective!r}; choose from {', '.join(impls.COLLECTIVES)}")


def _agree_max(x: float) -> float:
    return ringlet.allreduce(torch.tensor([x], dtype=torch.float64), op="max").item()


def _agree_sum(x: int) -> int:
    return int(ringlet.allreduce(torch.tensor([x], dtype=torch.int64)).item())


def implementations_for(collective: str, names: tuple[str, ...]) -> list[str]:
    """All-reduce gets one row per ringlet algorithm; the other collectives have one schedule each,
    so their ``ringlet:<algo>`` entries collapse into a single ``ringlet`` row."""
    if collective == "allreduce":
        return list(names)
    out: list[str] = []
    for n in names:
        n = "ringlet" if n.startswith("ringlet") else n
        if n not in out:
            out.append(n)
    return out


def run_sweep(spec: SweepSpec, progress=None) -> list[Row]:
    """Measure ``spec`` on every rank of the current ringlet job; every rank returns the same rows.

    ``progress(done, total, label)`` is called on every rank after each (collective, size, impl).
    """
    p, me = ringlet.size(), ringlet.rank()
    itemsize = torch.empty(0, dtype=spec.dtype).element_size()
    rows: list[Row] = []
    plan = {c: implementations_for(c, spec.implementations) for c in spec.collectives}
    total = sum(len(v) for v in plan.values()) * len(spec.sizes)
    done = 0
    for collective in spec.collectives:
        for size in spec.sizes:
            n = max(p, size // itemsize // p * p) if collective != "allreduce" and collective != "broadcast" \
                else max(1, size // itemsize)
            nbytes = n * itemsize
            inp0, out0, expected = _case(collective, n, p, me, spec.dtype, spec.op)
            made = {}
            for name in plan[collective]:
                impl = impls.make(name, collective, spec.op, spec.dtype)
                # Every rank must agree that the implementation exists before anyone runs it.
                if _agree_sum(0 if impl is None else 1) != p:
                    done += 1
                    if progress:
                        progress(done, total, f"{collective} {name} (skipped)")
                    continue
                made[name] = impl
            rows_here = {name: Row(collective, name, nbytes, n, str(spec.dtype).replace("torch.", ""),
                                   spec.op.name.lower()) for name in made}
            iters = spec.iters or iterations_for(nbytes, 256 << 20, 3, 50)
            for inplace in ((False, True) if spec.inplace and collective in impls.IN_PLACE else (False,)):
                # One input and output buffer shared by every implementation: the timings only need
                # data of the right size, and 1 GiB rows must fit several implementations.
                work = inp0.clone()
                out = None if out0 is None else out0.clone()
                runs = {name: (lambda impl=impl, work=work, out=out, inplace=inplace: impl(work, out, inplace))
                        for name, impl in made.items()}
                secs = time_interleaved(runs, ringlet.barrier, iters=iters, warmup=spec.warmup)
                runs.clear()  # frees the shared buffers before the correctness runs allocate theirs
                del work, out
                pre = "ip" if inplace else "oop"
                for name, impl in made.items():
                    sec = _agree_max(secs[name])
                    # correctness after the timed runs, on fresh inputs
                    fresh = inp0.clone()
                    got = impl(fresh, None if out0 is None else out0.clone(), inplace)
                    wrong = _agree_sum(int((got.reshape(-1) != expected.reshape(-1)).sum())
                                       if got.numel() == expected.numel() else expected.numel())
                    row = rows_here[name]
                    setattr(row, f"{pre}_us", sec * 1e6)
                    setattr(row, f"{pre}_algbw", nbytes / sec / 1e9)
                    setattr(row, f"{pre}_busbw", busbw(collective, p, nbytes, sec) / 1e9)
                    setattr(row, f"{pre}_wrong", wrong)
            for name in made:
                rows.append(rows_here[name])
                done += 1
                if progress:
                    progress(done, total, f"{collective} {name} {nbytes}B")
    return rows


def gaussian(n: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """Standard normal data for ``rank`` (gradient-like: every compressor loses something on it)."""
    g = torch.Generator().manual_seed(1_000_003 + rank)
    return torch.randn(n, generator=g, dtype=torch.float32).to(dtype)


class _Meter:
    """The transport's counter read around every call of one implementation (two snapshots, a lock each)."""

    def __init__(self) -> None:
        self.calls = self.sent = self.native = 0

    def wrap(self, fn):
        def run():
            before = ringlet.wire_bytes()
            out = fn()
            moved = ringlet.wire_bytes() - before
            self.calls, self.sent, self.native = self.calls + 1, self.sent + moved.sent, self.native + moved.native
            return out
        return run


def _agree_mean(x: float) -> float:
    return ringlet.allreduce(torch.tensor([x], dtype=torch.float64)).item() / ringlet.size()


def _compressed_rows(spec: SweepSpec, n: int) -> list[CompressionRow]:
    """Every compressor of ``spec`` at ``n`` elements: timed interleaved, with the state kept across calls;
    bytes counted around the warm-up and timed calls (not the barriers between blocks); then one call with
    a fresh state against the exact sum."""
    p, me = ringlet.size(), ringlet.rank()
    inp = gaussian(n, me, spec.dtype)
    made = {name: impls.CompressedAllreduce(name, n, spec.compression_algorithm) for name in spec.compressions}
    for impl in made.values():
        impl(inp, check=True)  # one checked call: the ranks agree on it; the counted calls run unchecked
    meters = {name: _Meter() for name in made}
    runs = {name: meters[name].wrap(lambda impl=impl: impl(inp)) for name, impl in made.items()}
    nbytes = n * inp.element_size()
    iters = spec.iters or iterations_for(nbytes, 256 << 20, 3, 50)
    secs = time_interleaved(runs, ringlet.barrier, iters=iters, warmup=spec.warmup)
    runs.clear()
    exact = sum(gaussian(n, r, spec.dtype).double() for r in range(p))
    rows = []
    for name, impl in made.items():
        m = meters[name]
        sec = _agree_max(secs[name])
        err = (impl(inp, state={}).double() - exact).abs().max().item()
        rows.append(CompressionRow(nbytes, n, str(spec.dtype).replace("torch.", ""), name, sec * 1e6, nbytes / sec / 1e9,
                                   _agree_max(m.sent / m.calls), _agree_mean(m.sent / m.calls),
                                   _agree_max(m.native / m.calls), max_err=_agree_max(err)))
    ref = rows[0].sent if rows and rows[0].compressor == "none" else float("nan")
    for row in rows:
        row.ratio = row.sent / ref if ref > 0 else float("nan")
    return rows


def run_compression_sweep(spec: SweepSpec, progress=None) -> list[CompressionRow]:
    """Measure ``spec.compressions`` at every size of ``spec`` on every rank of the current ringlet job;
    every rank returns the same rows. ``progress(done, total, label)`` after each size. ``ValueError``
    for a non-floating ``spec.dtype``."""
    if not spec.compressions:
        return []
    if not spec.dtype.is_floating_point:
        raise ValueError(f"--compression needs a floating dtype, got {spec.dtype}")
    itemsize = torch.empty(0, dtype=spec.dtype).element_size()
    rows: list[CompressionRow] = []
    for i, size in enumerate(spec.sizes):
        rows += _compressed_rows(spec, max(1, size // itemsize))
        if progress:
            progress(i + 1, len(spec.sizes), f"compression {size}B")
    return rows

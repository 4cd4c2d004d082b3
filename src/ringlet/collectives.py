"""Public collectives: validate locally, agree on metadata across ranks, pick an algorithm, run it.

Every collective has a blocking form, an ``_async`` form returning a :class:`~ringlet.runtime.Work`
handle (``wait()``, ``done()``), and where it makes sense an in-place form with a trailing ``_``.
"""
from __future__ import annotations

import contextlib
import struct
import hashlib
import threading
from typing import Sequence

import torch

from . import algorithms
from .algorithms import alltoall as alltoall_alg
from .algorithms import barrier as barrier_alg
from .algorithms import binomial, direct, executor, ring
from .group import Group
from .runtime import META_STEP, Runtime, Work
from .types import DTYPE_CODE, SUPPORTED_DTYPES, MismatchError, ReduceOp, dtype_name

_runtime: Runtime | None = None
_local = threading.local()  # per-thread override: in-process worlds run one rank per thread

KIND_NAMES = {1: "allreduce", 2: "broadcast", 3: "reduce", 4: "allgather", 5: "reducescatter",
              6: "alltoall", 7: "barrier"}
ALLREDUCE, BROADCAST, REDUCE, ALLGATHER, REDUCE_SCATTER, ALLTOALL, BARRIER = range(1, 8)
_MAX_DIMS = 8
# Metadata record: kind, dtype, op, root, algorithm, ndim, numel, shape[8], prescale, postscale.
_META_LEN = 7 + _MAX_DIMS + 2


def _set_runtime(rt: Runtime | None) -> None:
    global _runtime
    _runtime = rt


def runtime() -> Runtime:
    rt = getattr(_local, "runtime", None)
    if rt is not None:
        return rt
    if _runtime is None:
        raise ValueError("ringlet has not been initialized; use ringlet.init().")
    return _runtime


@contextlib.contextmanager
def use_runtime(rt: Runtime):
    """Make ``rt`` the runtime of the calling thread only (in-process worlds: one rank per thread)."""
    prev = getattr(_local, "runtime", None)
    _local.runtime = rt
    try:
        yield rt
    finally:
        _local.runtime = prev


# ---- local validation ---------------------------------------------------------------------------
def _check_tensor(t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"Expected a torch.Tensor, got {type(t).__name__}.")
    if t.dtype not in DTYPE_CODE:
        raise ValueError(f"Tensor type {t.dtype} is not supported. Supported: "
                         + ", ".join(dtype_name(d) for d in SUPPORTED_DTYPES) + ".")
    if not t.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    if t.is_sparse:
        raise ValueError("Sparse tensors are not supported; densify them first.")


def _group(rt: Runtime, group: Group | None) -> tuple[Group, int]:
    g = rt.world if group is None else group
    if not isinstance(g, Group):
        raise ValueError(f"group must be a ringlet Group, got {type(g).__name__}.")
    if rt.rank not in g:
        raise ValueError(f"Rank {rt.rank} is not a member of group {g.id} (ranks {list(g.ranks)}); "
                         "only members may call its collectives.")
    return g, g.rank_of(rt.rank)


def _check_root(g: Group, root: int) -> int:
    """``root`` is a global rank (Horovod habit); returns its group rank."""
    if not isinstance(root, int) or isinstance(root, bool):
        raise ValueError(f"root_rank must be an int, got {root!r}.")
    if root not in g:
        raise ValueError(f"Invalid root rank {root}: not a member of the group (ranks {list(g.ranks)}).")
    return g.rank_of(root)


def resolve_algorithm(name: str | None, rt: Runtime) -> str:
    name = (name or "auto").strip().lower()
    if name == "auto" and rt.options.algorithm not in ("", "auto"):
        name = rt.options.algorithm.strip().lower()
    name = algorithms.ALIASES.get(name, name)
    if name != "auto" and name != algorithms.NATIVE and name not in algorithms.ALLREDUCE:
        raise ValueError(f"Unknown algorithm {name!r}; choose one of auto, "
                         + ", ".join(algorithms.allreduce_names()) + ".")
    return name


_NATIVE_SMALL_BYTES = 64 << 10


def choose_allreduce(p: int, nbytes: int, host_of: tuple[int, ...]) -> str:
    """The size rule used by ``algorithm="auto"`` until the cost-model tuner replaces it."""
    reg = algorithms.ALLREDUCE
    hosts = len(set(host_of))
    # Recursive doubling has half the rounds of halving-doubling but sends the whole vector each round;
    # rounds cost tens of microseconds (MPI, shm) to milliseconds (Gloo), so it wins up to tens of KiB.
    if nbytes < (32 << 10) and "recursive_doubling" in reg:
        return "recursive_doubling"
    if nbytes < (64 << 10) and "halving_doubling" in reg:
        return "halving_doubling"
    if 1 < hosts < p and nbytes >= (1 << 20) and "hierarchical" in reg:
        return "hierarchical"
    return "ring"


_ALGO_CODE: dict[str, int] = {}


def _algo_code(name: str) -> int:
    if name not in _ALGO_CODE:
        # Stable across processes: derived from the name, not from registration order.
        _ALGO_CODE[name] = sum((i + 1) * ord(c) for i, c in enumerate(name)) % 100003
    return _ALGO_CODE[name]


def _f64_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


# ---- metadata exchange --------------------------------------------------------------------------
def _meta_record(kind: int, t: torch.Tensor | None, op: int = 0, root: int = -1, algo: str = "",
                 pre: float = 1.0, post: float = 1.0) -> list[int]:
    shape = list(t.shape) if t is not None else []
    rec = [kind, DTYPE_CODE[t.dtype] if t is not None else -1, int(op), root, _algo_code(algo) if algo else 0,
           len(shape), t.numel() if t is not None else 0]
    dims = shape[:_MAX_DIMS] + [0] * (_MAX_DIMS - min(len(shape), _MAX_DIMS))
    return rec + dims + [_f64_bits(pre), _f64_bits(post)]


def exchange(rt: Runtime, g: Group, grank: int, tag: int, values: Sequence[int]) -> torch.Tensor:
    """All-gather a small int64 record from every member: returns a ``[group size, len]`` tensor."""
    k = len(values)
    buf = torch.zeros(g.size * k, dtype=torch.int64)
    buf[grank * k:(grank + 1) * k] = torch.tensor(list(values), dtype=torch.int64)
    if g.size > 1:
        sched = direct.allgather(g.size, tuple([k] * g.size)) if g.size <= 16 else ring.allgather(g.size, tuple([k] * g.size))
        executor.execute(sched, grank, rt.transport, (buf,), int(ReduceOp.SUM), peers=g.ranks,
                         tag=tag + META_STEP, timeout=rt.options.timeout, workspace=rt.workspace)
    return buf.view(g.size, k)


def _shape_of(row: list[int]) -> list[int]:
    return row[7:7 + min(row[5], _MAX_DIMS)]


def _verify(metas: torch.Tensor, g: Group, *, ragged_dim0: bool = False) -> None:
    """Raise the same :class:`MismatchError` on every rank when the records disagree."""
    rows = metas.tolist()
    first = rows[0]
    kind = KIND_NAMES.get(first[0], str(first[0]))
    for r, row in enumerate(rows[1:], start=1):
        a, b = g.ranks[0], g.ranks[r]
        if row[0] != first[0]:
            raise MismatchError(f"Mismatched collective operations: rank {a} called {kind}, but rank {b} "
                                f"called {KIND_NAMES.get(row[0], row[0])}.")
        if row[1] != first[1]:
            raise MismatchError(f"Mismatched data types: One rank had type {dtype_name(SUPPORTED_DTYPES[first[1]])}, "
                                f"but another rank had type {dtype_name(SUPPORTED_DTYPES[row[1]])} "
                                f"(rank {a} vs rank {b}, {kind}).")
        sa, sb = _shape_of(first), _shape_of(row)
        if ragged_dim0:
            same = row[5] == first[5] and sa[1:] == sb[1:]
        else:
            same = row[5] == first[5] and sa == sb and row[6] == first[6]
        if not same:
            what = "tensor shapes" if not ragged_dim0 else "tensor shapes beyond the first dimension"
            raise MismatchError(f"Mismatched {kind} {what}: One rank sent a tensor of shape {sa}, but another "
                                f"rank sent a tensor of shape {sb} (rank {a} vs rank {b}).")
        if row[2] != first[2]:
            raise MismatchError(f"Mismatched {kind} reduction ops: rank {a} used {ReduceOp(first[2]).name}, "
                                f"rank {b} used {ReduceOp(row[2]).name}.")
        if row[3] != first[3]:
            raise MismatchError(f"Mismatched {kind} root ranks: rank {a} named {first[3]}, rank {b} named {row[3]}.")
        if row[4] != first[4]:
            raise MismatchError(f"Mismatched {kind} algorithms: ranks {a} and {b} forced different algorithms "
                                "(check RINGLET_ALGORITHM on every rank).")
        if row[-2:] != first[-2:]:
            raise MismatchError(f"Mismatched {kind} prescale/postscale factors between rank {a} and rank {b}.")


def _digest_agrees(rt: Runtime, g: Group, rec: list[int]) -> bool:
    """One native all-reduce (MAX) of ``[d, -d]`` for a digest ``d`` of the record: True when every member's
    record has the same digest. Costs one tiny backend all-reduce instead of an all-gather of records."""
    # 62 bits: all-gather trusts an agreeing digest for its sizes, so a collision must be negligible;
    # -d still fits in an int64.
    d = int.from_bytes(hashlib.blake2b(struct.pack(f"<{len(rec)}q", *rec), digest_size=8).digest(), "little")
    d &= (1 << 62) - 1
    buf = torch.tensor([d, -d], dtype=torch.int64)
    if not rt.transport.native_allreduce(buf, ReduceOp.MAX, g.ranks):
        return False
    return int(buf[0]) == -int(buf[1])


def _digest_in_step(rt: Runtime, g: Group, rec: list[int]) -> None:
    """All-to-all exchanges its splits anyway, but still takes part in the digest all-reduce every
    checked collective starts with on ``native_digest`` transports: a rank calling all-to-all while
    another calls all-reduce then meets it in the same backend call and both reach the record
    exchange, where the mismatch is reported, instead of waiting in different channels. The ragged
    parts (first dimension, element count) are zeroed: they may differ."""
    if rt.options.check and rt.transport.native_digest:
        _digest_agrees(rt, g, rec[:6] + [0, 0] + rec[8:])


def _checked(rt: Runtime, g: Group, grank: int, tag: int, rec: list[int], *, ragged_dim0: bool = False):
    """Exchange metadata records and raise :class:`MismatchError` on every rank if they disagree."""
    if rt.transport.native_digest and _digest_agrees(rt, g, rec):
        return None
    # Every member saw the same digest result, so either all of them get here or none does.
    metas = exchange(rt, g, grank, tag, rec)
    _verify(metas, g, ragged_dim0=ragged_dim0)
    return metas


# ---- scaling ------------------------------------------------------------------------------------
def scale_(t: torch.Tensor, factor: float) -> torch.Tensor:
    """``t *= factor`` in place; integers are scaled in float64 and truncated toward zero."""
    if factor == 1.0 or t.numel() == 0:
        return t
    if t.is_floating_point():
        return t.mul_(factor)
    return t.copy_(torch.trunc(t.double() * factor))


# ---- all-reduce ---------------------------------------------------------------------------------
def _run_allreduce(rt: Runtime, g: Group, grank: int, buf: torch.Tensor, op: ReduceOp, algo: str,
                   pre: float, post: float, check: bool) -> torch.Tensor:
    tag = rt.next_tag(g)
    flat = buf.view(-1)
    nbytes = flat.numel() * flat.element_size()
    if algo == "auto":
        algo_used = choose_allreduce(g.size, nbytes, g.host_of)
        if rt.transport.native_small and nbytes < _NATIVE_SMALL_BYTES:
            algo_used = algorithms.NATIVE  # falls back to the schedule below if the backend declines the dtype
    else:
        algo_used = algo
    if check and g.size > 1:
        _checked(rt, g, grank, tag, _meta_record(ALLREDUCE, buf, op, -1, algo, pre, post))
    scale_(flat, pre)
    if g.size > 1 and flat.numel() > 0:
        if algo_used == algorithms.NATIVE and algo == "auto":
            if not rt.transport.native_allreduce(flat, op, g.ranks):
                algo_used = choose_allreduce(g.size, nbytes, g.host_of)
        elif algo_used == algorithms.NATIVE:
            if not rt.transport.native_allreduce(flat, op, g.ranks):
                raise ValueError(f"algorithm 'native' is not available on the {rt.transport.name} transport.")
        if algo_used != algorithms.NATIVE:
            sched = algorithms.ALLREDUCE[algo_used](g.size, flat.numel(), g.host_of)
            executor.execute(sched, grank, rt.transport, (flat,), int(op), peers=g.ranks, tag=tag,
                             segment_bytes=rt.options.segment_bytes, timeout=rt.options.timeout, workspace=rt.workspace)
    scale_(flat, post / g.size if op == ReduceOp.AVG else post)
    return buf


def _allreduce_submit(tensor, op, algorithm, group, prescale_factor, postscale_factor, *, inplace, sync,
                      check: bool | None = None) -> Work:
    rt = runtime()
    check = rt.options.check if check is None else bool(check)
    _check_tensor(tensor)
    op = ReduceOp.parse(op)
    if op == ReduceOp.ADASUM:
        raise NotImplementedError("Adasum is not implemented by ringlet; use Sum or Average.")
    g, grank = _group(rt, group)
    algo = resolve_algorithm(algorithm, rt)
    buf = tensor if inplace else tensor.clone()
    return rt.submit(lambda: _run_allreduce(rt, g, grank, buf, op, algo, prescale_factor, postscale_factor, check),
                     sync=sync)


def allreduce(tensor: torch.Tensor, op=ReduceOp.SUM, algorithm: str = "auto", group: Group | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, *, check: bool | None = None) -> torch.Tensor:
    """Return ``postscale * reduce_op(prescale * tensor over all ranks of group)``.

    ``op``: sum, avg (sum then divide by the group size), min, max, product. Integer tensors are
    scaled in float64 and truncated toward zero (so an integer average truncates). ``algorithm``
    names one of :func:`ringlet.algorithms.allreduce_names` or ``"auto"``; ``RINGLET_ALGORITHM``
    overrides ``"auto"``. The input is not modified.

    ``check``: compare shape, dtype, op, algorithm and scale factors across ranks before data moves
    (default: ``RINGLET_CHECK``, on). ``False`` saves that exchange when the caller already knows the
    ranks agree, e.g. a layout validated once and then reused; a mismatch then gives wrong results or a
    timeout instead of a :class:`MismatchError`.
    """
    return _allreduce_submit(tensor, op, algorithm, group, prescale_factor, postscale_factor,
                             inplace=False, sync=True, check=check).wait()


def allreduce_async(tensor, op=ReduceOp.SUM, algorithm="auto", group=None, prescale_factor=1.0,
                    postscale_factor=1.0, *, check: bool | None = None) -> Work:
    """Like :func:`allreduce` but returns a handle at once; ``handle.wait()`` gives the output."""
    return _allreduce_submit(tensor, op, algorithm, group, prescale_factor, postscale_factor,
                             inplace=False, sync=False, check=check)


def allreduce_(tensor, op=ReduceOp.SUM, algorithm="auto", group=None, prescale_factor=1.0,
               postscale_factor=1.0, *, check: bool | None = None) -> torch.Tensor:
    """In-place :func:`allreduce`: ``tensor`` receives the result and is returned."""
    return _allreduce_submit(tensor, op, algorithm, group, prescale_factor, postscale_factor,
                             inplace=True, sync=True, check=check).wait()


def allreduce_async_(tensor, op=ReduceOp.SUM, algorithm="auto", group=None, prescale_factor=1.0,
                     postscale_factor=1.0, *, check: bool | None = None) -> Work:
    """In-place :func:`allreduce_async`: do not touch ``tensor`` until the handle completes."""
    return _allreduce_submit(tensor, op, algorithm, group, prescale_factor, postscale_factor,
                             inplace=True, sync=False, check=check)


# ---- broadcast and reduce -----------------------------------------------------------------------
def _run_rooted(rt, g, grank, buf, kind, root_g, op) -> torch.Tensor:
    tag = rt.next_tag(g)
    if rt.options.check and g.size > 1:
        _checked(rt, g, grank, tag, _meta_record(kind, buf, op, g.ranks[root_g]))
    # Interior tree ranks accumulate partial sums: off the root, work on a copy and return the input.
    flat = buf.view(-1) if kind == BROADCAST or grank == root_g else buf.reshape(-1).clone()
    if g.size > 1 and flat.numel() > 0:
        if kind == BROADCAST:
            sched = binomial.broadcast(g.size, flat.numel(), root_g)
        else:
            sched = binomial.reduce(g.size, flat.numel(), root_g)
        executor.execute(sched, grank, rt.transport, (flat,), int(op), peers=g.ranks, tag=tag,
                         segment_bytes=rt.options.segment_bytes, timeout=rt.options.timeout, workspace=rt.workspace)
    if kind == REDUCE and op == ReduceOp.AVG and grank == root_g:
        scale_(flat, 1.0 / g.size)
    return buf


def _rooted_submit(tensor, root_rank, group, kind, op, *, inplace, sync) -> Work:
    rt = runtime()
    _check_tensor(tensor)
    g, grank = _group(rt, group)
    root_g = _check_root(g, root_rank)
    op = ReduceOp.parse(op)
    buf = tensor if inplace else tensor.clone()
    return rt.submit(lambda: _run_rooted(rt, g, grank, buf, kind, root_g, op), sync=sync)


def broadcast(tensor: torch.Tensor, root_rank: int, group: Group | None = None) -> torch.Tensor:
    """Return a copy of ``root_rank``'s tensor on every rank (``root_rank`` is a global rank)."""
    return _rooted_submit(tensor, root_rank, group, BROADCAST, ReduceOp.SUM, inplace=False, sync=True).wait()


def broadcast_async(tensor, root_rank, group=None) -> Work:
    return _rooted_submit(tensor, root_rank, group, BROADCAST, ReduceOp.SUM, inplace=False, sync=False)


def broadcast_(tensor, root_rank, group=None) -> torch.Tensor:
    """In-place :func:`broadcast`: every rank's ``tensor`` becomes the root's."""
    return _rooted_submit(tensor, root_rank, group, BROADCAST, ReduceOp.SUM, inplace=True, sync=True).wait()


def broadcast_async_(tensor, root_rank, group=None) -> Work:
    return _rooted_submit(tensor, root_rank, group, BROADCAST, ReduceOp.SUM, inplace=True, sync=False)


def reduce(tensor: torch.Tensor, root_rank: int, op=ReduceOp.SUM, group: Group | None = None) -> torch.Tensor:
    """Reduce to ``root_rank``: the root gets ``op`` over all ranks; other ranks get their input back."""
    return _rooted_submit(tensor, root_rank, group, REDUCE, op, inplace=False, sync=True).wait()


def reduce_async(tensor, root_rank, op=ReduceOp.SUM, group=None) -> Work:
    return _rooted_submit(tensor, root_rank, group, REDUCE, op, inplace=False, sync=False)


def reduce_(tensor, root_rank, op=ReduceOp.SUM, group=None) -> torch.Tensor:
    """In-place :func:`reduce`; on non-root ranks the content of ``tensor`` is unspecified afterwards."""
    return _rooted_submit(tensor, root_rank, group, REDUCE, op, inplace=True, sync=True).wait()


def reduce_async_(tensor, root_rank, op=ReduceOp.SUM, group=None) -> Work:
    return _rooted_submit(tensor, root_rank, group, REDUCE, op, inplace=True, sync=False)


# ---- all-gather (ragged first dimension) --------------------------------------------------------
_ALLGATHER = {"ring": ring.allgather, "direct": direct.allgather}


def _run_allgather(rt, g, grank, tensor, algorithm: str = "ring", sizes: tuple[int, ...] | None = None,
                   check: bool = True) -> torch.Tensor:
    tag = rt.next_tag(g)
    rec = _meta_record(ALLGATHER, tensor)
    if g.size > 1 and sizes is not None and not check:
        dim0s = list(sizes)  # the caller vouches for every member's first dimension
    elif g.size > 1 and rt.transport.native_digest and _digest_agrees(rt, g, rec):
        # Every member's record equals this one, first dimension included: nothing to exchange.
        dim0s = [tensor.shape[0] if tensor.dim() else 1] * g.size
    elif g.size > 1:
        # Ragged (or mismatched): every member got here, as the digest result is the same everywhere.
        metas = exchange(rt, g, grank, tag, rec)
        if rt.options.check:
            _verify(metas, g, ragged_dim0=True)
        dim0s = [int(x) for x in metas[:, 7].tolist()] if tensor.dim() else [1] * g.size
    else:
        dim0s = [tensor.shape[0] if tensor.dim() else 1]
    row = tensor[0].numel() if tensor.dim() and tensor.shape[0] else (
        int(torch.tensor(tensor.shape[1:]).prod().item()) if tensor.dim() > 1 else 1)
    counts = tuple(d * row for d in dim0s)
    out_shape = (sum(dim0s),) + tuple(tensor.shape[1:]) if tensor.dim() else (g.size,)
    out = torch.empty(out_shape, dtype=tensor.dtype, device=tensor.device)
    flat = out.view(-1)
    off = sum(counts[:grank])
    flat[off:off + counts[grank]].copy_(tensor.reshape(-1))
    if g.size > 1 and sum(counts) > 0:
        sched = _ALLGATHER[algorithm](g.size, counts)
        executor.execute(sched, grank, rt.transport, (flat,), 0, peers=g.ranks, tag=tag,
                         segment_bytes=rt.options.segment_bytes, timeout=rt.options.timeout, workspace=rt.workspace)
    if sizes is not None and dim0s != list(sizes):
        # Raised after the data moved by the exchanged sizes, so that members whose lists were right
        # are not left waiting for this one.
        raise ValueError(f"allgather: sizes={list(sizes)} given, but the members' first dimensions are {dim0s}")
    return out


def _allgather_algorithm(algorithm: str) -> str:
    if algorithm not in _ALLGATHER:
        raise ValueError(f"unknown all-gather algorithm {algorithm!r}; choose from {sorted(_ALLGATHER)}")
    return algorithm


def _allgather_submit(tensor: torch.Tensor, group, algorithm: str, sizes, check: bool | None, *, sync: bool) -> Work:
    rt = runtime()
    _check_tensor(tensor)
    algorithm = _allgather_algorithm(algorithm)
    g, grank = _group(rt, group)
    if sizes is not None:
        sizes = tuple(int(s) for s in sizes)
        own = tensor.shape[0] if tensor.dim() else 1
        if len(sizes) != g.size or any(s < 0 for s in sizes) or sizes[grank] != own:
            raise ValueError(f"allgather: sizes must list the group's {g.size} first dimensions, this rank's "
                             f"({own}) at position {grank}; got {list(sizes)}")
    check = rt.options.check if check is None else bool(check)
    src = tensor if sync else tensor.clone()  # an async caller may change its tensor before the job runs
    return rt.submit(lambda: _run_allgather(rt, g, grank, src, algorithm, sizes, check), sync=sync)


def allgather_async(tensor: torch.Tensor, group: Group | None = None, algorithm: str = "ring", *,
                    sizes=None, check: bool | None = None) -> Work:
    return _allgather_submit(tensor, group, algorithm, sizes, check, sync=False)


def allgather(tensor: torch.Tensor, group: Group | None = None, algorithm: str = "ring", *,
              sizes=None, check: bool | None = None) -> torch.Tensor:
    """Concatenate every rank's tensor along dim 0 (sizes of dim 0 may differ; other dims must match).
    A 0-d tensor is treated as one row. ``algorithm``: ``"ring"`` (p-1 steps to the next rank) or
    ``"direct"`` (one step: every rank sends its block to every other; fewer dependent steps for ranks
    that cannot react at once, p-1 connections per rank).

    ``sizes``: every member's first dimension in group-rank order, when every caller knows them (MPI's
    ``Allgatherv`` counts). With ``check=False`` the data then moves at once, without the exchange that
    otherwise comes first; the lists must agree on every rank, or the result is wrong or the call times
    out. With checking on (default: ``RINGLET_CHECK``) the sizes are verified against the exchanged ones:
    a rank whose list differs raises ``ValueError`` once the data has moved (by the exchanged sizes), so
    the ranks whose lists were right complete the call."""
    return _allgather_submit(tensor, group, algorithm, sizes, check, sync=True).wait()


# ---- reduce-scatter -----------------------------------------------------------------------------
def split_rows(rows: int, p: int) -> list[int]:
    """Horovod's split of dim 0: the first ``rows % p`` ranks get one extra row."""
    return [rows // p + (1 if r < rows % p else 0) for r in range(p)]


def _run_reduce_scatter(rt, g, grank, buf, op, pre, post) -> torch.Tensor:
    tag = rt.next_tag(g)
    if rt.options.check and g.size > 1:
        _checked(rt, g, grank, tag, _meta_record(REDUCE_SCATTER, buf, op, -1, "", pre, post))
    rows = split_rows(buf.shape[0], g.size)
    row = buf[0].numel() if buf.shape[0] else 0
    counts = tuple(r * row for r in rows)
    flat = buf.view(-1)
    scale_(flat, pre)
    if g.size > 1 and flat.numel() > 0:
        sched = ring.reduce_scatter(g.size, counts)
        executor.execute(sched, grank, rt.transport, (flat,), int(op), peers=g.ranks, tag=tag,
                         segment_bytes=rt.options.segment_bytes, timeout=rt.options.timeout, workspace=rt.workspace)
    start = sum(rows[:grank])
    out = buf[start:start + rows[grank]].clone()
    scale_(out.view(-1), post / g.size if op == ReduceOp.AVG else post)
    return out


def _reduce_scatter_submit(tensor, op, group, pre, post, sync) -> Work:
    rt = runtime()
    _check_tensor(tensor)
    if tensor.dim() == 0:
        raise ValueError("reducescatter needs a tensor with at least one dimension (got a scalar).")
    op = ReduceOp.parse(op)
    g, grank = _group(rt, group)
    buf = tensor.clone()
    return rt.submit(lambda: _run_reduce_scatter(rt, g, grank, buf, op, pre, post), sync=sync)


def reduce_scatter(tensor: torch.Tensor, op=ReduceOp.SUM, group: Group | None = None,
                   prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce over ranks, then return this rank's slice of dim 0 (the first ``dim0 % size`` ranks get one
    extra row), as Horovod's ``reducescatter``."""
    return _reduce_scatter_submit(tensor, op, group, prescale_factor, postscale_factor, True).wait()


def reduce_scatter_async(tensor, op=ReduceOp.SUM, group=None, prescale_factor=1.0, postscale_factor=1.0) -> Work:
    return _reduce_scatter_submit(tensor, op, group, prescale_factor, postscale_factor, False)


# ---- all-to-all ---------------------------------------------------------------------------------
def _run_alltoall(rt, g, grank, tensor, splits) -> tuple[torch.Tensor, list[int]]:
    tag = rt.next_tag(g)
    p = g.size
    row = tensor[0].numel() if tensor.shape[0] else (
        int(torch.tensor(tensor.shape[1:]).prod().item()) if tensor.dim() > 1 else 1)
    if p > 1:
        rec = _meta_record(ALLTOALL, tensor) + list(splits)
        _digest_in_step(rt, g, rec[:_META_LEN])
        metas = exchange(rt, g, grank, tag, rec)
        if rt.options.check:
            _verify(metas[:, :_META_LEN], g, ragged_dim0=True)
        all_splits = tuple(tuple(int(x) for x in r) for r in metas[:, _META_LEN:].tolist())
    else:
        all_splits = (tuple(splits),)
    recv_splits = [all_splits[s][grank] for s in range(p)]
    out = torch.empty((sum(recv_splits),) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    src_flat, dst_flat = tensor.reshape(-1), out.view(-1)
    s_off = sum(splits[:grank]) * row
    r_off = sum(recv_splits[:grank]) * row
    n_self = splits[grank] * row
    dst_flat[r_off:r_off + n_self].copy_(src_flat[s_off:s_off + n_self])
    if p > 1:
        counts = tuple(tuple(c * row for c in r) for r in all_splits)
        sched = alltoall_alg.pairwise(p, counts)
        executor.execute(sched, grank, rt.transport, (dst_flat, src_flat), 0, peers=g.ranks, tag=tag,
                         segment_bytes=rt.options.segment_bytes, timeout=rt.options.timeout, workspace=rt.workspace)
    return out, recv_splits


def alltoall_async(tensor: torch.Tensor, splits: Sequence[int] | None = None, group: Group | None = None) -> Work:
    rt = runtime()
    _check_tensor(tensor)
    g, grank = _group(rt, group)
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension (got a scalar).")
    if splits is None:
        if tensor.shape[0] % g.size:
            raise ValueError(f"alltoall without splits needs dim 0 ({tensor.shape[0]}) divisible by the group size ({g.size}).")
        splits = [tensor.shape[0] // g.size] * g.size
    else:
        splits = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        if len(splits) != g.size:
            raise ValueError(f"alltoall splits has {len(splits)} entries; the group has {g.size} ranks.")
        if any(s < 0 for s in splits):
            raise ValueError("alltoall splits must be non-negative.")
        if sum(splits) != tensor.shape[0]:
            raise ValueError(f"alltoall splits sum to {sum(splits)}, but dim 0 of the tensor is {tensor.shape[0]}.")
    src = tensor.clone()
    return rt.submit(lambda: _run_alltoall(rt, g, grank, src, splits), sync=False)


def alltoall(tensor: torch.Tensor, splits: Sequence[int] | None = None, group: Group | None = None):
    """Send ``splits[d]`` rows (dim 0) to rank ``d``; return ``(output, received_splits)`` where the
    output concatenates the received rows in rank order. Without ``splits`` dim 0 is split evenly."""
    return alltoall_async(tensor, splits, group).wait()


# ---- barrier ------------------------------------------------------------------------------------
def _run_barrier(rt, g, grank) -> None:
    tag = rt.next_tag(g)
    if g.size > 1:
        if rt.options.check:
            _checked(rt, g, grank, tag, _meta_record(BARRIER, None))
        flag = torch.zeros(1, dtype=torch.uint8)
        executor.execute(barrier_alg.dissemination(g.size), grank, rt.transport, (flag,), 0, peers=g.ranks,
                         tag=tag, timeout=rt.options.timeout, workspace=rt.workspace)


def barrier_async(group: Group | None = None) -> Work:
    rt = runtime()
    g, grank = _group(rt, group)
    return rt.submit(lambda: _run_barrier(rt, g, grank), sync=False)


def barrier(group: Group | None = None) -> None:
    """Return once every member of ``group`` has entered the barrier."""
    rt = runtime()
    g, grank = _group(rt, group)
    rt.submit(lambda: _run_barrier(rt, g, grank), sync=True).wait()

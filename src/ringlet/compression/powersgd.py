"""``powersgd``: low-rank all-reduce of the matrices in a bucket (Vogels et al., 2019).

Each tensor of the bucket with two or more dimensions is viewed as a matrix ``M`` of ``n`` rows (its
first dimension) by ``m`` columns (the rest). With ``r = min(rank, n, m)`` it is compressed when that
pays, ``r * (n + m) * min_compression_rate < n * m``; every other tensor (1-D ones included) is summed
exactly. One step, the same on every rank (``allreduce`` is an in-place float32 SUM over the group)::

    M  = input + residual                    # error feedback (residual: zeros at first)
    P  = M @ Q                               # n x r, Q: m x r, the same on every rank (kept as Q^T)
    allreduce([all P's | all uncompressed tensors])          # first call, one float32 buffer
    P^ = orthonormal columns spanning P      # Gram-Schmidt or QR; zero columns stay zero
    Qw = M^T @ P^                            # this rank's m x r
    residual = M - P^ @ Qw^T                 # what this rank's share of the result leaves out
    allreduce([all Qw's])                    # second call, one float32 buffer: Q = sum of the Qw's
    output = P^ @ Q^T  (uncompressed tensors: their sum)

The output written back into ``flat`` is the **sum** over ranks of the approximations (the caller
divides for an average): ``sum_w P^ Qw^T = P^ P^^T sum_w M_w``, the projection of the exact sum onto the
span of ``P^``. So the result is exact when ``r = min(n, m)`` or when the summed matrix has rank
``<= r``, and over steps the outputs add up to the inputs' sum minus the ranks' last residuals.
A call is skipped when its buffer would be empty (decided by the shapes alone, so on every rank alike).

Error feedback is built in (``error_feedback=True``, as in the paper): the residual is this rank's
``M - P^ Qw^T`` (zero on the uncompressed tensors), kept in ``state["residual"]`` as a flat float32
tensor of the bucket's size, where :func:`~ringlet.compression.error_feedback.rescale_residuals_` finds
it; entries that come out non-finite are reset to zero. Wrapping PowerSGD in
:class:`~ringlet.compression.error_feedback.ErrorFeedback` is refused.

``Q`` comes from a ``torch.Generator`` (CPU, kept in ``state["generator"]``, seeded with
``state["seed"]`` when the caller put one there, else with the compressor's ``seed``): every rank draws
the same ``Q`` without communicating, provided every rank's state gets the same seed. With
``warm_start`` the summed ``Q`` of one step is the next step's (kept in ``state["q"]``; identical on
every rank when the all-reduce returns the same bits everywhere); a warm ``Q`` with a zero or non-finite
column is drawn afresh (checking costs one device-to-host sync per step). A NaN or Inf in a compressed tensor makes its whole output NaN.

State keys: ``"shapes"`` (a later call with other shapes raises ``ValueError``), ``"residual"``,
``"q"`` (the ``Q^T`` of each compressed matrix, ``r x m``), ``"generator"``, optional ``"seed"``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import torch

from .base import Compressor, check_input
from ._common import check_int, state_generator

__all__ = ["PowerSGD"]

_ORTHOGONALIZE = ("gram_schmidt", "qr")
_RANK_TOL = 1e-4  # relative norm below which a projected column counts as dependent


class _Part(NamedTuple):
    """One tensor of the bucket: where it lies in ``flat``, and its matrix view when compressed."""

    offset: int
    numel: int
    rows: int
    cols: int
    rank: int  # 0: summed uncompressed


def _gram_schmidt_(a: torch.Tensor) -> None:
    """Orthonormalise the columns of ``a`` in place (each projected out twice, for accuracy). A column
    with less than :data:`_RANK_TOL` of its norm left after projection becomes zero: what is left then is
    rounding, and normalising it would invent a direction (for a column parallel to an earlier one, the
    rounding error can even point along that one). NaN/Inf propagate."""
    for j in range(a.shape[1]):
        col = a[:, j]
        before = torch.linalg.vector_norm(col)
        if j:
            prev = a[:, :j]
            for _ in range(2):
                col.sub_(prev @ (prev.T @ col))
        norm = torch.linalg.vector_norm(col)
        keep = (norm > _RANK_TOL * before) & (norm > 0)
        col.mul_(torch.where(keep, norm.reciprocal(), 0.0))


def _carve(buf: torch.Tensor, sizes: list[tuple[int, int]]) -> list[torch.Tensor]:
    """Consecutive ``rows x cols`` matrix views of ``buf``, from its start."""
    out, at = [], 0
    for rows, cols in sizes:
        out.append(buf[at:at + rows * cols].view(rows, cols))
        at += rows * cols
    return out


class PowerSGD(Compressor):
    """Rank-``rank`` PowerSGD with error feedback (see the module doc).

    ``rank``: integer >= 1. ``warm_start``: reuse last step's ``Q``. ``min_compression_rate``: >= 0; a
    matrix is compressed when ``r * (n + m) * rate < n * m``. ``orthogonalize``: ``"gram_schmidt"``
    or ``"qr"``. ``error_feedback``: keep the residual. ``seed``: ``Q``'s seed when the state has none.
    ``ValueError`` for a bad parameter.
    """

    reduces_by = "custom"

    def __init__(self, rank: int = 2, warm_start: bool = True, min_compression_rate: float = 2.0,
                 orthogonalize: str = "gram_schmidt", error_feedback: bool = True, seed: int = 0):
        check_int(rank, "PowerSGD rank", 1)
        check_int(seed, "PowerSGD seed", 0)
        if isinstance(min_compression_rate, bool) or not isinstance(min_compression_rate, (int, float)) \
                or not 0 <= min_compression_rate < math.inf:
            raise ValueError(f"PowerSGD min_compression_rate must be finite and >= 0, got {min_compression_rate!r}")
        if orthogonalize not in _ORTHOGONALIZE:
            raise ValueError(f"PowerSGD orthogonalize must be one of {_ORTHOGONALIZE}, got {orthogonalize!r}")
        self.rank, self.warm_start, self.seed = rank, bool(warm_start), seed
        self.min_compression_rate = float(min_compression_rate)
        self.orthogonalize, self.error_feedback = orthogonalize, bool(error_feedback)
        self.name = "powersgd" if rank == 2 else f"powersgd:{rank}"

    def plan(self, shapes: list[tuple[int, ...]]) -> list[_Part]:
        """Where each tensor of ``shapes`` lies in the flat buffer and whether (at which rank) it is
        compressed. ``ValueError`` for a shape with a negative or non-integer dimension."""
        parts, offset = [], 0
        for shape in shapes:
            dims = tuple(shape)
            if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in dims):
                raise ValueError(f"{self.name}: bad tensor shape {shape!r}")
            numel = math.prod(dims)
            rows = dims[0] if len(dims) >= 2 else 0
            cols = numel // rows if rows else 0
            r = min(self.rank, rows, cols)
            pays = r > 0 and r * (rows + cols) * self.min_compression_rate < rows * cols
            parts.append(_Part(offset, numel, rows, cols, r if pays else 0))
            offset += numel
        return parts

    def wire_bytes_for(self, shapes: list[tuple[int, ...]]) -> int:
        """Bytes one rank hands to ``allreduce`` in one step for a bucket of ``shapes``: the two float32
        buffers, ``4 * (sum of r * (n + m) over compressed matrices + numel of the others)``."""
        return 4 * sum(p.rank * (p.rows + p.cols) if p.rank else p.numel for p in self.plan(shapes))

    def wire_bytes(self, numel: int) -> int:
        """The input taken as one 1-D tensor, which PowerSGD sums uncompressed: ``4 * numel``. For a
        bucket of matrices use :meth:`wire_bytes_for`."""
        return 4 * numel

    def compress(self, flat: torch.Tensor, state: dict | None = None) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError("powersgd has no single payload: it runs its own two all-reduces "
                                  "(reduces_by='custom'); call allreduce_(flat, state, allreduce, shapes)")

    def decompress(self, payload: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError("powersgd has no single payload (reduces_by='custom'); use allreduce_")

    def _parts(self, flat: torch.Tensor, state: dict, shapes) -> list[_Part]:
        shapes = [(flat.numel(),)] if shapes is None else [tuple(s) for s in shapes]
        parts = self.plan(shapes)
        total = sum(p.numel for p in parts)
        if total != flat.numel():
            raise ValueError(f"{self.name}: shapes hold {total} elements, the buffer {flat.numel()}")
        kept = state.setdefault("shapes", shapes)
        if kept != shapes:
            raise ValueError(f"{self.name}: this state was used for shapes {kept}, now given {shapes}; "
                             "use one state per bucket")
        return parts

    def _draw(self, gen: torch.Generator, part: _Part, device: torch.device) -> torch.Tensor:
        return torch.randn(part.rank, part.cols, generator=gen).to(device)

    def _qts(self, state: dict, low: list[_Part], device: torch.device) -> list[torch.Tensor]:
        """This step's ``Q^T`` (``r x m``, rows contiguous) for every compressed matrix: last step's when
        warm and sound, else drawn."""
        gen = state_generator(state, torch.device("cpu"), self.seed)
        qts = state.get("q") if self.warm_start else None
        if qts is None:
            return [self._draw(gen, p, device) for p in low]
        sound = [torch.isfinite(q).all() & (torch.linalg.vector_norm(q, dim=1) > 0).all() for q in qts]
        if sound and not bool(torch.stack(sound).all()):
            qts = [q if bool(ok) else self._draw(gen, p, device) for q, ok, p in zip(qts, sound, low)]
        return qts

    def _orthogonalize_(self, p: torch.Tensor) -> None:
        if self.orthogonalize == "qr":
            p.copy_(torch.linalg.qr(p).Q)
        else:
            _gram_schmidt_(p)

    def _input(self, flat: torch.Tensor, state: dict) -> torch.Tensor:
        """``M``: the input plus the residual, in float32, in the residual's own memory when error
        feedback keeps one (no new bucket-sized tensor per step), else in ``flat`` itself when it is
        float32 (the output overwrites it anyway)."""
        res = state.get("residual") if self.error_feedback else None
        if res is not None and res.shape == flat.shape and res.dtype == torch.float32:
            return res.add_(flat)
        if self.error_feedback or flat.dtype != torch.float32:
            return flat.to(torch.float32, copy=True)
        return flat

    def allreduce_(self, flat: torch.Tensor, state: dict, allreduce: Callable[[torch.Tensor], None],
                   shapes: list[tuple[int, ...]] | None = None) -> torch.Tensor:
        """Replace ``flat`` by the sum over ranks of its rank-``rank`` approximation (module doc).
        ``TypeError`` for a bad ``flat``; ``ValueError`` when ``shapes`` do not add up to ``flat`` or differ
        from the ones this ``state`` saw before."""
        check_input(flat, self.name)
        if not isinstance(state, dict):
            raise TypeError(f"{self.name}: allreduce_ keeps Q and the residual in a state dict, got "
                            f"{type(state).__name__}")
        parts = self._parts(flat, state, shapes)
        low = [p for p in parts if p.rank]
        dense = [p for p in parts if not p.rank]
        x = self._input(flat, state)
        mats = [x[p.offset:p.offset + p.numel].view(p.rows, p.cols) for p in low]
        qts = self._qts(state, low, flat.device)

        n_p = sum(p.rows * p.rank for p in low)
        first = x.new_empty(n_p + sum(p.numel for p in dense))
        ps = _carve(first, [(p.rows, p.rank) for p in low])
        for m, qt, pm in zip(mats, qts, ps):
            torch.mm(m, qt.T, out=pm)  # with Q^T's rows contiguous, the fast way round on CPU
        _pack(first[n_p:], x, dense)
        if first.numel():
            allreduce(first)
        # A non-finite entry of any rank's M reaches the summed P (Q has no zero entries in practice), and
        # only then can the residual turn non-finite: checking this small buffer spares a pass over the
        # bucket when, as almost always, everything is finite.
        finite = bool(torch.isfinite(first).all())

        second = x.new_empty(sum(p.cols * p.rank for p in low))
        qws = _carve(second, [(p.rank, p.cols) for p in low])  # this rank's Qw^T
        for m, pm, qw in zip(mats, ps, qws):
            self._orthogonalize_(pm)
            torch.mm(pm.T, m, out=qw)
            if self.error_feedback:
                m.addmm_(pm, qw, alpha=-1.0)  # x becomes the residual
        if self.error_feedback:
            for p in dense:
                x[p.offset:p.offset + p.numel].zero_()
            state["residual"] = x if finite else x.nan_to_num_(0.0, 0.0, 0.0)
        if second.numel():
            allreduce(second)

        for p, pm, qw in zip(low, ps, qws):
            dst = flat[p.offset:p.offset + p.numel].view(p.rows, p.cols)
            if flat.dtype == torch.float32:
                torch.mm(pm, qw, out=dst)
            else:
                dst.copy_(pm @ qw)
        _unpack(flat, first[n_p:], dense)
        if self.warm_start:
            state["q"] = qws
        return flat

    def __repr__(self) -> str:
        return (f"PowerSGD(rank={self.rank}, warm_start={self.warm_start}, "
                f"min_compression_rate={self.min_compression_rate:g}, orthogonalize={self.orthogonalize!r}, "
                f"error_feedback={self.error_feedback}, seed={self.seed})")


def _pack(buf: torch.Tensor, x: torch.Tensor, parts: list[_Part]) -> None:
    """Copy the ``parts`` of ``x`` one after another into ``buf``."""
    at = 0
    for p in parts:
        buf[at:at + p.numel].copy_(x[p.offset:p.offset + p.numel])
        at += p.numel


def _unpack(flat: torch.Tensor, buf: torch.Tensor, parts: list[_Part]) -> None:
    """The inverse of :func:`_pack`: ``buf``'s consecutive segments back to the ``parts`` of ``flat``."""
    at = 0
    for p in parts:
        flat[p.offset:p.offset + p.numel].copy_(buf[at:at + p.numel])
        at += p.numel

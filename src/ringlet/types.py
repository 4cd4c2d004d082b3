"""Shared vocabulary: reduction ops, supported dtypes, errors and frozen options."""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Callable

import torch


class ReduceOp(enum.IntEnum):
    """Reduction operators. Values follow Horovod's numbering so they can be exchanged as ints."""

    AVG = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5

    @classmethod
    def parse(cls, op: "ReduceOp | str | int") -> "ReduceOp":
        if isinstance(op, ReduceOp):
            return op
        if isinstance(op, str):
            key = op.strip().upper()
            aliases = {"AVERAGE": "AVG", "MEAN": "AVG", "PROD": "PRODUCT"}
            key = aliases.get(key, key)
            if key in cls.__members__:
                return cls[key]
            raise ValueError(f"Unknown reduction op {op!r}; use one of sum, avg, min, max, product.")
        if isinstance(op, int):
            return cls(op)
        raise ValueError(f"Unknown reduction op {op!r}")


def _add_(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.add_(src)


def _min_(dst: torch.Tensor, src: torch.Tensor) -> None:
    torch.minimum(dst, src, out=dst)


def _max_(dst: torch.Tensor, src: torch.Tensor) -> None:
    torch.maximum(dst, src, out=dst)


def _mul_(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.mul_(src)


@dataclass(frozen=True, slots=True)
class Reduction:
    """What a reduction op does element-wise: ``combine(dst, src)`` sets ``dst = dst (op) src`` in place.

    ``averages``: the result is divided by the group size once, after the elements are combined (AVG).
    Executors and compressors call ``combine``; nothing compares op codes inline.
    """

    name: str
    op: ReduceOp
    combine: Callable[[torch.Tensor, torch.Tensor], None]
    averages: bool = False


REDUCTIONS: dict[ReduceOp, Reduction] = {
    ReduceOp.SUM: Reduction("sum", ReduceOp.SUM, _add_),
    ReduceOp.AVG: Reduction("avg", ReduceOp.AVG, _add_, averages=True),
    ReduceOp.MIN: Reduction("min", ReduceOp.MIN, _min_),
    ReduceOp.MAX: Reduction("max", ReduceOp.MAX, _max_),
    ReduceOp.PRODUCT: Reduction("product", ReduceOp.PRODUCT, _mul_),
}


def reduction(op: "Reduction | ReduceOp | str | int") -> Reduction:
    """The :class:`Reduction` of ``op`` (a Reduction, a :class:`ReduceOp`, its name or its Horovod code).
    ``ValueError`` for an unknown op; ``NotImplementedError`` for Adasum."""
    if type(op) is ReduceOp and op in REDUCTIONS:
        return REDUCTIONS[op]
    if isinstance(op, Reduction):
        return op
    rop = ReduceOp.parse(op)
    if rop == ReduceOp.ADASUM:
        raise NotImplementedError("Adasum is not implemented by ringlet; use Sum or Average.")
    return REDUCTIONS[rop]


# Exchanged in metadata as small ints; the order is part of the wire format (the one code table).
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
)
DTYPE_CODE = {dt: i for i, dt in enumerate(SUPPORTED_DTYPES)}


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


class RingletError(RuntimeError):
    """A collective failed: cross-rank mismatch, dead peer, transport failure.

    Subclasses ``RuntimeError`` so that Horovod scripts catching ``HorovodInternalError`` semantics
    (a ``RuntimeError``) keep working.
    """


class MismatchError(RingletError):
    """Ranks submitted collectives whose metadata (shape, dtype, op, root, ...) disagree."""


class PeerError(RingletError):
    """A peer died, fell silent, closed its connection or the transport failed.

    ``rank`` and ``host``: the peer that caused it, when known (a silent or dead peer named by the
    liveness monitor); None otherwise."""

    def __init__(self, *args, rank: int | None = None, host: str | None = None):
        super().__init__(*args)
        self.rank = rank
        self.host = host


class CollectiveTimeout(RingletError, TimeoutError):
    """A collective did not complete within its timeout."""


def _env_float(name: str, default: float) -> float:
    val = os.environ.get(name)
    return float(val) if val not in (None, "") else default


def _env_bool(name: str, default: bool) -> bool:
    val = os.environ.get(name)
    if val in (None, ""):
        return default
    return val.strip().lower() not in ("0", "false", "no", "off")


TUNE_MODES = ("off", "load", "auto")  # Options.tune: no network model / a matching profile / calibrate if none


@dataclass(frozen=True, slots=True)
class Options:
    """Process-wide knobs. Read once from the environment at ``init``; never mutated afterwards.

    ``check``: exchange a small metadata record before each collective so that mismatched
    shapes/dtypes/ops raise on every rank instead of hanging (``RINGLET_CHECK=0`` switches it off).
    ``timeout``: seconds a single collective may wait on a peer (``RINGLET_TIMEOUT``).
    ``segment_bytes``: pipeline granularity of the executor (``RINGLET_SEGMENT_BYTES``, default 4 MiB;
    docs/design.md says why).
    ``algorithm``: forced algorithm name or ``"auto"`` (``RINGLET_ALGORITHM``).
    ``tune``: what ``init`` does about the network model (``RINGLET_TUNE``): ``"load"`` uses the
    calibration profile matching the job when there is one, ``"auto"`` also calibrates quickly and saves
    a profile when there is none, ``"off"`` uses none (see docs/tuning.md). ``ValueError`` for another.
    ``profile``: path of the calibration profile to use instead of the per-user cache (``RINGLET_PROFILE``).
    """

    check: bool = True
    timeout: float = 300.0
    segment_bytes: int = 4 << 20
    algorithm: str = "auto"
    tune: str = "load"
    profile: str = ""

    def __post_init__(self) -> None:
        if self.tune not in TUNE_MODES:
            raise ValueError(f"tune must be one of {', '.join(TUNE_MODES)} (RINGLET_TUNE), got {self.tune!r}")

    @classmethod
    def from_env(cls) -> "Options":
        return cls(
            check=_env_bool("RINGLET_CHECK", True),
            timeout=_env_float("RINGLET_TIMEOUT", 300.0),
            segment_bytes=int(_env_float("RINGLET_SEGMENT_BYTES", float(4 << 20))),
            algorithm=os.environ.get("RINGLET_ALGORITHM", "auto") or "auto",
            tune=(os.environ.get("RINGLET_TUNE", "") or "load").strip().lower(),
            profile=os.environ.get("RINGLET_PROFILE", "").strip(),
        )

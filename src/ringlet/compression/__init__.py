"""Gradient compressors: how a flat buffer travels (:mod:`.base` states the protocol).

Built in: ``none`` (float32), ``fp16``, ``bf16``, ``int8`` (per-chunk scaled bytes), ``topk`` (the largest
1 %), ``powersgd`` (rank-2 low-rank all-reduce with its own error feedback), and
:class:`ErrorFeedback` around any of them but ``powersgd`` (name suffix ``+ef``). :func:`get` turns a
name or an object into a :class:`~ringlet.compression.base.Compressor`.
"""
from __future__ import annotations

from .base import Compressor, check_input
from .error_feedback import ErrorFeedback, rescale_residuals_, reset_residuals_
from .halves import BF16, FP16, HalfCompressor
from .int8 import Int8
from .none import NoCompression
from .powersgd import PowerSGD
from .topk import TopK

NONE = NoCompression()
INT8 = Int8()
TOPK = TopK()
POWERSGD = PowerSGD()

_BY_NAME = {"none": NONE, "fp16": FP16, "bf16": BF16, "int8": INT8, "topk": TOPK, "powersgd": POWERSGD}
_WITH_ARG = {
    "int8": lambda arg: Int8(stochastic=True) if arg == "stochastic" else Int8(chunk=int(arg)),
    "topk": lambda arg: TopK(fraction=float(arg)),
    "powersgd": lambda arg: PowerSGD(rank=int(arg)),
}
_NAMES = "none, fp16, bf16, int8, int8:stochastic, int8:CHUNK, topk, topk:FRACTION, powersgd, powersgd:RANK"


def get(spec: "str | Compressor | None") -> Compressor:
    """The compressor for ``spec``: a :class:`Compressor` (returned as is), None (``none``), or a name
    ``BASE[:ARG][+ef]`` — ``BASE`` one of ``none fp16 bf16 int8 topk powersgd``; ``ARG``: ``int8:stochastic``
    or ``int8:CHUNK``, ``topk:FRACTION``, ``powersgd:RANK``; ``+ef`` wraps it in :class:`ErrorFeedback`
    (``int8+ef``, ``topk:0.05+ef``). ``ValueError`` for an unknown or malformed name (``powersgd+ef``
    included: PowerSGD keeps its own error feedback), ``TypeError`` for anything else."""
    if spec is None:
        return NONE
    if isinstance(spec, Compressor):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"compression must be a name or a ringlet.compression.Compressor, got {type(spec).__name__}")
    key = spec.strip().lower()
    ef = key.endswith("+ef")
    base, colon, arg = key[:-3 if ef else None].partition(":")
    try:
        comp = _WITH_ARG[base](arg) if colon else _BY_NAME[base]
    except (KeyError, ValueError) as err:
        why = f"unknown name {base!r}" if isinstance(err, KeyError) else str(err)
        raise ValueError(f"bad compressor {spec!r} ({why}); choose one of {_NAMES} (any of them but "
                         "powersgd may end in +ef), or pass a ringlet.compression.Compressor") from None
    return ErrorFeedback(comp) if ef else comp


__all__ = ["Compressor", "check_input", "NoCompression", "HalfCompressor", "Int8", "TopK", "PowerSGD",
           "ErrorFeedback", "rescale_residuals_", "reset_residuals_",
           "NONE", "FP16", "BF16", "INT8", "TOPK", "POWERSGD", "get"]

"""Gradient compressors: how a flat buffer travels (:mod:`.base` states the protocol).

Built in: ``none`` (float32), ``fp16``, ``bf16``. :func:`get` turns a name or an object into a
:class:`~ringlet.compression.base.Compressor`.
"""
from __future__ import annotations

from .base import Compressor, check_input
from .halves import BF16, FP16, HalfCompressor
from .none import NoCompression

NONE = NoCompression()

_BY_NAME = {"none": NONE, "fp16": FP16, "bf16": BF16}


def get(spec: "str | Compressor | None") -> Compressor:
    """The compressor for ``spec``: a :class:`Compressor` (returned as is), a built-in name, or None
    (``none``). ``ValueError`` for an unknown name, ``TypeError`` for anything else."""
    if spec is None:
        return NONE
    if isinstance(spec, Compressor):
        return spec
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key not in _BY_NAME:
            raise ValueError(f"unknown compressor {spec!r}; choose one of {', '.join(sorted(_BY_NAME))} "
                             "or pass a ringlet.compression.Compressor")
        return _BY_NAME[key]
    raise TypeError(f"compression must be a name or a ringlet.compression.Compressor, got {type(spec).__name__}")


__all__ = ["Compressor", "check_input", "NoCompression", "HalfCompressor", "NONE", "FP16", "BF16", "get"]

"""Sizes in bytes as people write them: ``4``, ``1K``, ``64KiB``, ``256M``, ``1G`` (powers of 1024, as
nccl-tests). Standard library only: the library (``Priority(partition_bytes="1M")``) and the tools
(``ringlet bench``, ``ringlet simulate``, ``ringlet cluster``) parse them alike."""
from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.I)
_UNIT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from ``"4"``, ``"1K"``, ``"64KiB"``, ``"256M"``, ``"1G"``. ``ValueError`` when it is not a
    size or not a whole number of bytes."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (try 4, 64K, 256M, 1G)")
    value = float(m.group(1)) * _UNIT[m.group(2).lower()]
    if value != int(value):
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(value)

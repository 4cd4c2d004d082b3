"""Message sizes as the command line writes them: ``4``, ``1K``, ``256M``, ``1G`` (powers of 1024, as
nccl-tests), ranges ``1K:1G`` stepped by a factor, and comma lists of either."""
from __future__ import annotations

from ..sizes import parse_size

__all__ = ["MAX_ROWS", "fmt_size", "parse_size", "size_range"]

MAX_ROWS = 4096


def size_range(spec: str, factor: float = 2.0) -> tuple[int, ...]:
    """Sizes of ``"A:B"`` (``A, A·f, A·f², ...`` up to ``B``), of ``"A"``, or of a comma list of those, in
    the order given. ``ValueError`` for a bad size, ``A > B``, ``A < 1`` in a range, ``factor <= 1``, or
    more than :data:`MAX_ROWS` sizes."""
    if not factor > 1:
        raise ValueError(f"the size factor must be > 1, got {factor}")
    out: list[int] = []
    parts = [part for part in str(spec).split(",") if part.strip()]
    if not parts:
        raise ValueError(f"no sizes in {spec!r} (try 1K:1G)")
    for part in parts:
        if ":" not in part:
            out.append(parse_size(part))
            continue
        lo_text, _, hi_text = part.partition(":")
        lo, hi = parse_size(lo_text), parse_size(hi_text)
        if lo < 1 or lo > hi:
            raise ValueError(f"bad size range {part.strip()!r}: need 1 <= start <= end")
        size = float(lo)
        while size <= hi * (1 + 1e-12):
            out.append(int(round(size)))
            size *= factor
            if len(out) > MAX_ROWS:
                raise ValueError(f"size range {spec!r} has more than {MAX_ROWS} sizes")
    return tuple(dict.fromkeys(out))


def fmt_size(nbytes: int) -> str:
    """``1 KiB``, ``256 MiB``, ``1000 B``: the largest binary unit that divides ``nbytes``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"

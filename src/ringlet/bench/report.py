"""Printing and saving sweep results: an nccl-tests style table, JSON, CSV and a busbw plot; the
compressed all-reduces of ``--compression`` in a table of their own and in the JSON."""
from __future__ import annotations

import csv
import json
import math
from typing import Iterable

from ..busbw_plot import busbw_axes
from .sweep import CompressionRow, Row

_COLS = ("size", "count", "dtype", "op", "impl", "oop_us", "oop_algbw", "oop_busbw", "oop_wrong",
         "ip_us", "ip_algbw", "ip_busbw", "ip_wrong")


def _num(x: float, fmt: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return format("n/a", ">" + fmt.split(".")[0])
    return format(x, fmt)


def table(rows: Iterable[Row], header: str = "") -> str:
    """Rows grouped by collective: size, count, type, op, implementation, then out-of-place and
    in-place time (µs), algbw and busbw (GB/s) and #wrong."""
    out = [header] if header else []
    rows = list(rows)
    for coll in dict.fromkeys(r.collective for r in rows):
        out.append(f"# {coll}")
        out.append(f"{'size':>12} {'count':>11} {'type':>8} {'op':>7} {'implementation':<26}"
                   f"{'time':>11} {'algbw':>7} {'busbw':>7} {'#wrong':>7}"
                   f"{'time':>11} {'algbw':>7} {'busbw':>7} {'#wrong':>7}")
        out.append(f"{'(B)':>12} {'(elements)':>11} {'':>8} {'':>7} {'':<26}"
                   f"{'(us)':>11} {'(GB/s)':>7} {'(GB/s)':>7} {'':>7}"
                   f"{'(us)':>11} {'(GB/s)':>7} {'(GB/s)':>7} {'':>7}")
        out.append(f"{'':>66}{'out-of-place':^32}{'in-place':^32}")
        for r in (r for r in rows if r.collective == coll):
            out.append(f"{r.size:>12} {r.count:>11} {r.dtype:>8} {r.op:>7} {r.impl:<26}"
                       f"{_num(r.oop_us, '11.1f')}{_num(r.oop_algbw, '8.3f')}{_num(r.oop_busbw, '8.3f')}"
                       f"{r.oop_wrong if r.oop_wrong >= 0 else 'n/a':>7}"
                       f"{_num(r.ip_us, '11.1f')}{_num(r.ip_algbw, '8.3f')}{_num(r.ip_busbw, '8.3f')}"
                       f"{r.ip_wrong if r.ip_wrong >= 0 else 'n/a':>7}")
    return "\n".join(out)


def compression_table(rows: Iterable[CompressionRow], algorithm: str = "ring") -> str:
    """Per size and compressor: median time (µs, slowest rank), algbw (GB/s), bytes sent per rank per call
    as the transport counted them (max over ranks), the ratio to ``none``'s and the max abs error against
    the exact float64 sum."""
    rows = list(rows)
    out = [f"# allreduce, compressed (sum; schedule {algorithm}; bytes: the transport's count of what one rank "
           "sent per call, max over ranks; error: one call vs the float64 sum)",
           f"{'size':>12} {'count':>11} {'type':>8} {'compressor':<16}{'time':>11} {'algbw':>7} "
           f"{'sent':>13} {'vs none':>8} {'max abs err':>12}",
           f"{'(B)':>12} {'(elements)':>11} {'':>8} {'':<16}{'(us)':>11} {'(GB/s)':>7} {'(B/rank/call)':>13} "
           f"{'':>8} {'':>12}"]
    for r in rows:
        out.append(f"{r.size:>12} {r.count:>11} {r.dtype:>8} {r.compressor:<16}{_num(r.us, '11.1f')}"
                   f"{_num(r.algbw, '8.3f')}{_num(r.sent, '14.0f')}{_num(r.ratio, '9.4f')}{_num(r.max_err, '13.3g')}")
    native = sum(r.native for r in rows)
    if native:
        out.append(f"# bytes also handed to the backend's own all-reduce (not in 'sent'): {native:.0f} per call, "
                   "summed over rows")
    return "\n".join(out)


def total_wrong(rows: Iterable[Row]) -> int:
    return sum(max(0, r.oop_wrong) + max(0, r.ip_wrong) for r in rows)


def write_json(path: str, rows: list[Row], meta: dict, compression: list[CompressionRow] | None = None) -> None:
    """``{"meta", "rows"}``, and ``"compression"`` (the :class:`CompressionRow` fields) when there are any."""
    data = {"meta": meta, "rows": [r.as_dict() for r in rows]}
    if compression:
        data["compression"] = [r.as_dict() for r in compression]
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def write_csv(path: str, rows: list[Row]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("collective",) + _COLS)
        for r in rows:
            d = r.as_dict()
            w.writerow([r.collective] + [d["impl"] if c == "impl" else d[c] for c in _COLS])


def plot(path: str, rows: list[Row], title: str = "", link_gbps: float | None = None) -> None:
    """busbw against size (log axis), one line per collective × implementation; the link rate as a line."""
    series: dict[str, list[tuple[int, float]]] = {}
    colls = {r.collective for r in rows}
    for r in rows:
        label = r.impl if len(colls) == 1 else f"{r.collective} {r.impl}"
        series.setdefault(label, []).append((r.size, r.oop_busbw))
    with busbw_axes(path, title) as ax:
        for label, pts in series.items():
            pts.sort()
            ax.plot([s for s, _ in pts], [b for _, b in pts], marker="o", markersize=3, label=label)
        if link_gbps:
            ax.axhline(link_gbps, color="black", linestyle="--", linewidth=1, label=f"link {link_gbps:.3f} GB/s")

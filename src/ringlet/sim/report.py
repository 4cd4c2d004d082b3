"""Showing a sweep: an nccl-tests style table, JSON, and a busbw-against-size plot (matplotlib, Agg)."""
from __future__ import annotations

import json
import os

from ..busbw_plot import busbw_axes
from ..tuning.network import Network, Topology, host_layout
from .result import SimResult
from .sizes import fmt_size

_HEAD = (f"{'size':>10} {'algorithm':<20} {'time (us)':>13} {'algbw GB/s':>11} {'busbw GB/s':>11} "
         f"{'steps':>6} {'segment':>9} {'source':>7}")


def table(rows: list[SimResult]) -> str:
    """One line per row, a header first."""
    lines = [_HEAD]
    for r in rows:
        seg = "-" if r.segment_bytes is None else fmt_size(r.segment_bytes).replace(" ", "")
        lines.append(f"{fmt_size(r.nbytes):>10} {r.algorithm:<20} {r.seconds * 1e6:13.2f} {r.algbw / 1e9:11.3f} "
                     f"{r.busbw / 1e9:11.3f} {r.steps:6d} {seg:>9} {r.source:>7}")
    return "\n".join(lines)


def describe(topology: Topology, network: Network) -> str:
    """A one-line summary of what was simulated."""
    per = sorted(set(host_layout(topology.host_of)))
    shape = f"{topology.nhosts} hosts × {per[0]}" if len(per) == 1 else f"{topology.nhosts} hosts of {per} ranks"
    inter, intra = network["inter"], network["intra"]
    return (f"{topology.size} ranks ({shape}); inter {inter.gbit:.3g} Gbit/s, {inter.alpha * 1e6:.3g} us; "
            f"intra {intra.gbit:.3g} Gbit/s, {intra.alpha * 1e6:.3g} us; "
            f"gamma {'0' if not network.gamma else f'{1e-9 / network.gamma:.3g} GB/s'}")


def write_json(path: str, rows: list[SimResult], topology: Topology, network: Network, notices: list[str],
               seconds: float) -> None:
    """Rows and the setup as JSON (``rows[i]`` as :meth:`SimResult.to_dict`)."""
    doc = {"ranks": topology.size, "host_of": list(topology.host_of), "network": network.to_dict(),
           "notices": notices, "wall_seconds": seconds, "rows": [r.to_dict() for r in rows]}
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)


def plot(path: str, rows: list[SimResult], title: str = "") -> None:
    """busbw (GB/s) against size (log axis), one line per algorithm; predicted points hollow."""
    with busbw_axes(path, title) as ax:
        for i, algorithm in enumerate(dict.fromkeys(r.algorithm for r in rows)):
            pts = sorted((r.nbytes, r.busbw / 1e9, r.source) for r in rows if r.algorithm == algorithm and r.nbytes)
            line, = ax.plot([s for s, _, _ in pts], [b for _, b, _ in pts], marker="o", markersize=3,
                            label=algorithm, linestyle=("-", "--", "-.", ":")[i % 4])  # coinciding lines stay visible
            model = [(s, b) for s, b, src in pts if src == "model"]
            if model:
                ax.plot(*zip(*model), linestyle="none", marker="o", markersize=6, markerfacecolor="none",
                        color=line.get_color())

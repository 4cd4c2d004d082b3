"""The frame of a busbw-against-size plot, shared by ``ringlet bench`` and ``ringlet simulate``
(matplotlib's Agg backend: no display needed)."""
from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def busbw_axes(path: str, title: str = "") -> Iterator:
    """Yield matplotlib axes to draw lines on; then label them (log₂ size axis, busbw in GB/s), add the
    legend and save the figure to ``path`` (its folder is created)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        yield ax
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)

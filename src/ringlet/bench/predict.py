"""``ringlet bench --predict``: the cost model's time beside every measured all-reduce row.

For each ``ringlet:<algorithm>`` all-reduce row the prediction is
``ringlet.tuning.cost.predict_allreduce(algorithm, bytes, topology, network, itemsize=...,
segment_bytes=<the executor's segment>)`` on the job's topology and the profile's network; the segment
is the one the executor runs that algorithm with (:func:`executor_segment`). It is
compared with the in-place time (the schedule alone; the out-of-place form adds a copy the model does
not count), and stored in the row's ``extra``: ``predicted_us``, ``pred_err`` (``(predicted −
measured) / measured``) and ``pred_against`` (which column was used). Rows of ``auto``, ``native`` and
other implementations get no prediction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

from .sweep import Row

Predictor = Callable[..., object]  # predict_allreduce's signature; returns an object with .seconds


def default_predictor() -> Predictor | None:
    """``ringlet.tuning.cost.predict_allreduce``, or ``None`` where the cost model does not exist (an
    import error inside it still surfaces)."""
    try:
        from ringlet.tuning.cost import predict_allreduce
    except ModuleNotFoundError as exc:
        if exc.name != "ringlet.tuning.cost":
            raise
        return None
    return predict_allreduce


def algorithm_of(row: Row) -> str | None:
    """The schedule a row measured (``ringlet:ring`` → ``ring``), or ``None`` when it has none to predict."""
    if row.collective != "allreduce" or not row.impl.startswith("ringlet:"):
        return None
    name = row.impl.split(":", 1)[1]
    return None if name in ("auto", "native", "") else name


def _measured(row: Row) -> tuple[float, str]:
    if row.ip_us == row.ip_us and row.ip_us > 0:  # not NaN
        return row.ip_us, "ip_us"
    return row.oop_us, "oop_us"


@dataclass(frozen=True)
class PredictionSetup:
    """What predicting a row needs: the profile's ``network``, the job's ``topology``, the element size,
    the cost model's ``predict`` (``predict_allreduce``), ``segment(algorithm, nbytes)``, the segment
    the executor runs that algorithm with (:func:`executor_segment`), and whether the measured calls
    ``checked`` their metadata (the runtime's ``check`` option: the model adds the network's ``check``)."""

    network: object
    topology: object
    itemsize: int
    predict: Predictor
    segment: Callable[[str, int], int | None]
    checked: bool = False


def executor_segment(default: int, host_of: tuple[int, ...], itemsize: int,
                     cap: int | None = None, model=None) -> Callable[[str, int], int | None]:
    """``segment(algorithm, nbytes)``: the segment size the executor runs a forced ``algorithm`` with —
    the cost ``model``'s choice where the runtime's selector has one (``select.allreduce_choice`` with
    ``rt.selector.model``), else ``default`` (the runtime's ``segment_bytes``); at most ``cap`` (the
    transport's ``max_segment_bytes``) when given."""
    from ringlet.tuning import select

    def capped(seg: int | None) -> int | None:
        return seg if not cap else min(seg or cap, cap)

    if model is None:
        return lambda algorithm, nbytes: capped(default)

    def segment(algorithm: str, nbytes: int) -> int | None:
        choice = select.allreduce_choice(algorithm, len(host_of), nbytes, tuple(host_of), select.Capabilities(),
                                         model, itemsize)
        return capped(choice.segment_bytes or default)

    return segment


def add_predictions(rows: Iterable[Row], setup: PredictionSetup) -> int:
    """Put the prediction of every predictable row into its ``extra`` (with ``pred_segment_bytes``, the
    segment it assumed); return how many rows got one. A prediction that raises ``ValueError`` (an
    algorithm the model does not know) leaves its row alone."""
    done = 0
    for row in rows:
        algo = algorithm_of(row)
        if algo is None:
            continue
        segment = setup.segment(algo, row.size)
        try:
            pred = setup.predict(algo, row.size, setup.topology, setup.network, itemsize=setup.itemsize,
                                 segment_bytes=segment, checked=setup.checked)
        except ValueError:
            continue
        measured, column = _measured(row)
        us = float(pred.seconds) * 1e6
        row.extra.update(predicted_us=us, pred_against=column, pred_segment_bytes=segment,
                         pred_err=(us - measured) / measured if measured > 0 else math.nan)
        done += 1
    return done


def table(rows: Iterable[Row]) -> str:
    """The predicted rows: size, algorithm, measured and predicted time, relative error."""
    out = ["# allreduce: measured (in-place) against predicted by the cost model",
           f"{'size':>12} {'algorithm':<22}{'measured':>12} {'predicted':>12} {'error':>8}",
           f"{'(B)':>12} {'':<22}{'(us)':>12} {'(us)':>12} {'(%)':>8}"]
    for r in rows:
        if "predicted_us" not in r.extra:
            continue
        measured = getattr(r, r.extra["pred_against"])
        out.append(f"{r.size:>12} {r.impl.split(':', 1)[1]:<22}{measured:12.1f} {r.extra['predicted_us']:12.1f} "
                   f"{100 * r.extra['pred_err']:+8.1f}")
    return "\n".join(out)

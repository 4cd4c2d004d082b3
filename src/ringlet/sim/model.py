"""Rows the simulator does not replay: predictions of :mod:`ringlet.tuning.cost` (imported on first use).

The cost model evaluates the same timing model from the same schedules, so a predicted row agrees with a
replayed one within a few percent where no link is shared (docs/simulator.md). All-reduce rows use the
cost model's per-algorithm object (``AllreduceCost``: one schedule per algorithm, any size) where it has
one, else ``predict_allreduce``; other collectives build their schedule and call ``predict``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..tuning.network import Network, Topology
from .collectives import Collective


class ModelUnavailable(RuntimeError):
    """``ringlet.tuning.cost`` cannot be imported, so rows cannot fall back to the cost model."""


@dataclass(frozen=True, slots=True)
class Predicted:
    seconds: float
    steps: int
    segment_bytes: int | None


def _cost_module():
    try:
        return importlib.import_module("ringlet.tuning.cost")
    except ImportError as exc:
        raise ModelUnavailable(f"the cost model (ringlet.tuning.cost) is not available: {exc}") from exc


class CostModel:
    """Predictions for one ``topology`` and ``network``; keeps the cost model's per-algorithm objects.
    :class:`ModelUnavailable` on creation when there is no cost model."""

    def __init__(self, topology: Topology, network: Network, itemsize: int = 4):
        self.topology = topology
        self.network = network
        self.itemsize = itemsize
        self._cost = _cost_module()
        self._allreduce: dict[str, object] = {}

    def _allreduce_cost(self, algorithm: str):
        make = getattr(self._cost, "AllreduceCost", None)
        if make is None:
            return None
        if algorithm not in self._allreduce:
            self._allreduce[algorithm] = make(algorithm, self.topology)
        return self._allreduce[algorithm]

    def predict(self, coll: Collective, algorithm: str, nbytes: int, segment_bytes: int | None) -> Predicted:
        """The cost model's time for ``nbytes`` (a multiple of the item size) of ``algorithm``."""
        name = coll.resolve(algorithm)
        topo, net, size = self.topology, self.network, self.itemsize
        if coll.name == "allreduce":
            fast = self._allreduce_cost(name)
            if fast is not None:
                pred = fast.predict(nbytes, net, size, segment_bytes)
            else:
                pred = self._cost.predict_allreduce(name, nbytes, topo, net, itemsize=size, segment_bytes=segment_bytes)
        else:
            schedule = coll.build(name, topo.size, nbytes // size, topo.host_of)
            pred = self._cost.predict(schedule, topo, net, itemsize=size, segment_bytes=segment_bytes)
        return Predicted(float(pred.seconds), int(pred.steps), pred.segment_bytes)

"""The simulator: ringlet's schedules replayed in virtual time on a modelled network with link contention.

``simulate(collective, algorithm, nbytes, topology, network, segment_bytes=None)`` replays one row;
``run_sweep(SweepOptions(...))`` a table of them within a time budget, falling back to the cost model
for rows it cannot replay in time. The model and its limits: docs/simulator.md.
"""
from __future__ import annotations

from .api import predicted, simulate
from .collectives import COLLECTIVES, Collective, collective
from .engine import Replay, replay
from .model import ModelUnavailable
from .result import MODEL, REPLAY, SimResult
from .segments import WHOLE, Auto, Fixed, SegmentPolicy, Whole, policy
from .sizes import fmt_size, parse_size, size_range
from .sweep import SweepOptions, SweepResult, run_sweep

__all__ = ["COLLECTIVES", "Collective", "MODEL", "ModelUnavailable", "REPLAY", "Replay", "SegmentPolicy",
           "SimResult", "SweepOptions", "SweepResult", "WHOLE", "Whole", "Fixed", "Auto", "collective",
           "fmt_size", "parse_size", "policy", "predicted", "replay", "run_sweep", "simulate", "size_range"]

"""Numbers and decisions: which algorithm to use when, and the network constants behind it.

Framework-free (no torch: numpy and the schedules of :mod:`ringlet.algorithms`) and below the engine,
which it never imports: the engine is handed a :class:`~ringlet.tuning.select.Selector`, and
calibration is handed a prober (:class:`ringlet.engine.probe.Prober`) that runs the timed collectives."""
from .online import OnlineChoice
from .step_tuner import StepTuner, TrialPlan

__all__ = ["OnlineChoice", "StepTuner", "TrialPlan"]

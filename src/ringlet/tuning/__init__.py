"""Numbers and decisions: which algorithm to use when. Framework-free; callers run the collectives."""
from .online import OnlineChoice
from .step_tuner import StepTuner, TrialPlan

__all__ = ["OnlineChoice", "StepTuner", "TrialPlan"]

"""Pipeline parallelism: :class:`Pipeline` cuts an ``nn.Sequential`` into stages over the ranks
(:mod:`.split`), runs GPipe or 1F1B action lists (:mod:`.schedules`) with activations and gradients over
:mod:`ringlet.p2p` (:mod:`.boundary`, :mod:`.stage`), and averages each stage's gradients over its
replicas through ringlet's DDP. docs/pipeline.md."""
from .pipeline import Pipeline
from .schedules import SCHEDULES, bubble_fraction
from .stage import StepStats

__all__ = ["Pipeline", "StepStats", "SCHEDULES", "bubble_fraction"]

"""``ringlet bench``: nccl-tests style sweeps of collectives × implementations × sizes, checked."""
from .sweep import Row, SweepSpec, run_sweep

__all__ = ["Row", "SweepSpec", "run_sweep"]

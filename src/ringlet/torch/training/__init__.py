"""ringlet's own training layer: :class:`DistributedDataParallel` (buckets, one reduction strategy per
bucket, overlap with backward), sufficient factors of fully connected layers, and the comm hooks for
stock ``torch.nn.parallel.DistributedDataParallel``.

Everything here reaches the network through :mod:`ringlet.torch.comm`, the one seam shared with the
Horovod-compatible facade (the rest of :mod:`ringlet.torch`); nothing here imports the facade.
"""
from .ddp import DistributedDataParallel

__all__ = ["DistributedDataParallel"]

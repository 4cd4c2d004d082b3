"""ringlet on Ray: :class:`RayExecutor`, the API of Horovod's ``horovod.ray.RayExecutor``, runs a function
on Ray actors that form one ringlet job; see docs/ray.md.

Ray Train's ``TorchTrainer`` needs nothing from this package: ``ringlet.init()`` in the training function
adopts the process group Ray Train made (docs/ray.md). Importing this package does not import ``ray``;
the executor does, when it starts, and says how to install it when it is missing.
"""
from .executor import RayExecutor
from .settings import RaySettings

__all__ = ["RayExecutor", "RaySettings"]

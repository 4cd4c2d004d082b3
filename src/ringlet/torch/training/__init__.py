"""ringlet's own training layer: the one bucket reducer (:mod:`.reducer`: one reduction strategy per
bucket — dense, compressed, sufficient factors — shared by :class:`DistributedDataParallel`, the Horovod
facade's ``DistributedOptimizer`` and the comm hooks), :class:`DistributedDataParallel` (overlap with
backward; :class:`Priority`: front layers' gradients first, overlapping the next
forward), sufficient factors of fully connected layers, the comm hooks for
stock ``torch.nn.parallel.DistributedDataParallel``, mixed precision (:class:`GradScaler` with the
overflow decision agreed by the group, :class:`MasterWeights`), ZeRO (:class:`ZeroOptimizer`: optimizer
state, gradients and parameters sharded over the group), and synchronising less often
(:class:`LocalSGD`: post-local SGD; :class:`DiLoCo`: an outer optimizer on averaged parameter deltas),
mixtures of experts (:class:`MoE`, experts spread over ranks and fed by all-to-all; :func:`moe_parallel` /
:func:`moe_zero_optimizers`: expert parameters averaged over their own replicas), and pipeline parallelism
(:class:`Pipeline`: stages of an ``nn.Sequential`` over the ranks, replicas through DDP).

Gradients and model state reach the network through :mod:`ringlet.torch.comm`, the one seam shared with
the Horovod-compatible facade (the rest of :mod:`ringlet.torch`); nothing here imports the facade. Two
kinds of traffic go to the core directly, since they are part of the forward and backward and have no
scheduler to choose: the pipeline's activations (:mod:`ringlet.p2p`) and the experts' tokens
(:func:`ringlet.alltoall`).
"""
from .adapt import Adapt
from .amp import GradScaler
from .ddp import DistributedDataParallel
from .diloco import DiLoCo
from .experts import MoE, moe_parallel, moe_zero_optimizers, split_moe_params
from .local_sgd import LocalSGD
from .master_weights import MasterWeights
from .pipeline import Pipeline
from .priority import Priority
from .zero import ZeroOptimizer, ZeroOptions

__all__ = ["DistributedDataParallel", "GradScaler", "MasterWeights", "LocalSGD", "DiLoCo", "Priority", "Adapt",
           "ZeroOptimizer", "ZeroOptions", "MoE", "moe_parallel", "moe_zero_optimizers", "split_moe_params",
           "Pipeline"]

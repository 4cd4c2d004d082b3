"""Horovod's PyTorch API on ringlet: change ``import horovod.torch as hvd`` to ``import ringlet.torch as hvd``
and launch with ``ringlet run``.

Ops are matched across ranks by name by a background coordinator (see :mod:`.coordinator`), validated
before data moves, fused and executed in the same order everywhere. The contract is
``shared/specs/horovod-torch-api.md``; deliberate differences: Adasum raises ``NotImplementedError``;
``barrier`` does not wait for ops submitted before it (it is matched by name like any op).
"""
from __future__ import annotations

from ringlet.timeline import start_timeline, stop_timeline

from . import mpi_ops
from .basics import *  # noqa: F401,F403
from .basics import HorovodInternalError, init, is_initialized, rank, shutdown, size
from .mpi_ops import *  # noqa: F401,F403
from .mpi_ops import (Adasum, Average, Max, Min, Product, Sum, barrier, join, poll, sparse_allreduce_async,
                      synchronize)
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set

# Differentiable versions (autograd) replace the raw ops of mpi_ops under the same names.
from . import hooks
from .autograd import (allgather, allreduce, alltoall, broadcast, grouped_allgather, grouped_allreduce,
                       grouped_reducescatter, reducescatter)
from .compression import Compression
from .training import (DiLoCo, DistributedDataParallel, GradScaler, LocalSGD, MasterWeights, MoE, Pipeline,
                       Priority, ZeroOptimizer, ZeroOptions, moe_parallel, moe_zero_optimizers, split_moe_params)
from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .optimizer import DistributedOptimizer
from .sync_batch_norm import SyncBatchNorm

try:  # elastic training is optional (a later module)
    from . import elastic
except ImportError:  # pragma: no cover
    pass

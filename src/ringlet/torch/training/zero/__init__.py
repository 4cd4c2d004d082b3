"""ZeRO: model state sharded over the data-parallel group (stage 1: optimizer state; 2: also gradients;
3: also parameters), and checkpoints of it. ``layout`` says where every element lives; :class:`ZeroOptimizer`
is the front (``docs/zero.md``)."""
from .layout import Even, Layout, Partition, WholeParameters
from .optimizer import ZeroOptimizer
from .options import ZeroOptions
from .reduce import Reducer
from .reduce_compressed import CompressedReducer
from .reduce_hierarchical import HierarchicalReducer

__all__ = ["Layout", "Partition", "Even", "WholeParameters", "ZeroOptimizer", "ZeroOptions", "Reducer",
           "CompressedReducer", "HierarchicalReducer"]

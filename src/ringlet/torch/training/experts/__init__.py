"""Mixture of experts over all-to-all (``docs/experts.md``): :class:`MoE` (the layer), its gating
(:mod:`.gate`), the token exchange (:mod:`.dispatch`), the expert-parallel and expert-data-parallel groups
(:mod:`.groups`) and the helpers that average expert and dense parameters over their own groups with
ringlet's DDP or ZeRO (:mod:`.parallel`)."""
from .groups import ExpertGroups, expert_groups
from .layer import MoE
from .parallel import MoEDistributedDataParallel, MoEParams, moe_parallel, moe_zero_optimizers, split_moe_params

__all__ = ["MoE", "ExpertGroups", "expert_groups", "MoEParams", "split_moe_params", "moe_parallel",
           "moe_zero_optimizers", "MoEDistributedDataParallel"]

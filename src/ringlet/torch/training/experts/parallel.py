"""Data parallelism around mixture-of-experts layers: expert parameters are averaged over their replicas
only (the expert-data-parallel group, ``span / ep_size`` ranks), everything else over the layers' span.

Scaling: a rank's expert receives the tokens of every rank of its expert-parallel group, so without a
wrapper its gradient is the sum of ``ep_size`` ranks' loss gradients. The helpers divide it by
``ep_size`` (a gradient hook on each expert parameter) before it is averaged over the replicas: the
expert's gradient is then the gradient of the mean loss over all ranks of the span, like the dense
parameters' average — so data-parallel MoE training takes the steps a single process would take on all
ranks' batches (with each rank's capacity and routing).

* :func:`split_moe_params` (DeepSpeed's ``split_params_into_different_moe_groups_for_optimizer``): which
  parameters are dense and which belong to experts, and the groups;
* :func:`moe_parallel`: ringlet's :class:`~ringlet.torch.training.ddp.DistributedDataParallel` for the
  dense parameters over the span (expert state in ``_ddp_params_and_buffers_to_ignore``) and, for each
  MoE layer, one for its experts over the expert-data-parallel group, run inside the layer's forward;
* :func:`moe_zero_optimizers`: two :class:`~ringlet.torch.training.zero.ZeroOptimizer` (stages 1-2), the
  dense parameters sharded over the span, the experts' over the expert-data-parallel group.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

import torch

from ..ddp import DistributedDataParallel
from ..zero import ZeroOptimizer, ZeroOptions
from .groups import ExpertGroups
from .layer import MoE

__all__ = ["MoEParams", "split_moe_params", "moe_parallel", "moe_zero_optimizers", "MoEDistributedDataParallel"]

# DistributedDataParallel options that also apply to the experts' wrapper.
_EXPERT_DDP_OPTIONS = ("broadcast_buffers", "bucket_cap_mb", "first_bucket_cap_mb", "gradient_as_bucket_view",
                       "algorithm", "tune", "compression", "adapt", "sufficient_factors")


@dataclasses.dataclass(frozen=True)
class MoEParams:
    """``dense``: the model's trainable parameters outside experts; ``experts``: the experts' trainable
    parameters (every MoE layer's, in layer order); ``expert_names``: the names of the experts' parameters
    and buffers in the model; ``layers``: the MoE layers; ``groups``: their :class:`ExpertGroups`
    (``groups.dp_group`` averages ``experts``, ``groups.span`` — None: the world — ``dense``)."""

    dense: list[torch.nn.Parameter]
    experts: list[torch.nn.Parameter]
    expert_names: frozenset[str]
    layers: list[MoE]
    groups: ExpertGroups


def split_moe_params(model: torch.nn.Module) -> MoEParams:
    """Split ``model``'s parameters into dense and expert ones. ``ValueError`` when the model has no
    :class:`MoE` layer, or layers of different spans or ``ep_size`` (their experts would need
    different groups)."""
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    if not layers:
        raise ValueError("The model has no ringlet.torch.MoE layer; use DistributedDataParallel directly.")
    first = layers[0].groups
    for m in layers[1:]:
        if (m.groups.span, m.groups.ep_size) != (first.span, first.ep_size):
            raise ValueError("Every MoE layer of one model must span the same group with the same ep_size "
                             f"(found ep_size {first.ep_size} and {m.groups.ep_size}).")
    expert_ids = {id(t) for m in layers for t in list(m.experts.parameters()) + list(m.experts.buffers())}
    names = frozenset(n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if id(t) in expert_ids)
    dense = [p for p in model.parameters() if p.requires_grad and id(p) not in expert_ids]
    experts = [p for m in layers for p in m.experts.parameters() if p.requires_grad]
    return MoEParams(dense, experts, names, layers, first)


def _scale_expert_grads(split: MoEParams) -> None:
    """Divide expert gradients by ``ep_size`` (module doc); once per layer."""
    for m in split.layers:
        if getattr(m, "_parallel", False):
            raise ValueError("This model's MoE layers are already under moe_parallel or moe_zero_optimizers.")
        m._parallel = True
    ep = split.groups.ep_size
    if ep > 1:
        for p in split.experts:
            p.register_hook(lambda g: g / ep)


class _ExpertsDDP(DistributedDataParallel):
    """The experts' wrapper: runs inside the model's forward, so it leaves the step marks and the
    forward/backward spans of the timeline to the outer wrapper."""

    _traces_steps = False


class MoEDistributedDataParallel(DistributedDataParallel):
    """What :func:`moe_parallel` returns: ringlet's DDP over the dense parameters, whose :meth:`no_sync`
    also holds back the experts' wrappers (:attr:`expert_wrappers`, one per MoE layer; empty when each
    expert has a single replica)."""

    def __init__(self, module: torch.nn.Module, expert_wrappers: list[DistributedDataParallel], **options):
        super().__init__(module, **options)
        self.expert_wrappers = list(expert_wrappers)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forwards inside the block skip the reduction of dense and expert gradients alike."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(super().no_sync())
            for wrapper in self.expert_wrappers:
                stack.enter_context(wrapper.no_sync())
            yield


def moe_parallel(model: torch.nn.Module, **ddp_options) -> MoEDistributedDataParallel:
    """Wrap ``model`` (with :class:`MoE` layers) for data parallelism: returns a
    :class:`MoEDistributedDataParallel` (ringlet's ``DistributedDataParallel(model, group=span,
    **ddp_options)``) over the dense parameters; each MoE
    layer's experts get their own ``DistributedDataParallel`` over the expert-data-parallel group (with
    ``ddp_options``' bucket, algorithm, compression and buffer options; ``sufficient_factors`` off unless
    given), called inside the layer's forward. After ``backward()`` dense gradients are averaged over the
    span, expert gradients over their replicas, both as the gradient of the mean loss (module doc).

    Every rank calls it for the same model in the same order. ``ValueError``: no MoE layer, layers that
    disagree on their groups, ``group``/``process_group`` other than the layers' span, ``priority=`` (its
    overlap of the next forward does not reach the experts' wrapper), a model wrapped before."""
    if ddp_options.get("priority") is not None:
        raise ValueError("moe_parallel does not support priority=: the experts' gradients are reduced by "
                         "their own wrapper, which the next forward's overlap would not wait for.")
    split = split_moe_params(model)
    for key in ("group", "process_group"):
        if ddp_options.pop(key, None) not in (None, split.groups.span):
            raise ValueError(f"moe_parallel: {key} must be the MoE layers' group (or None); pass group= to MoE.")
    expert_options = {k: v for k, v in ddp_options.items() if k in _EXPERT_DDP_OPTIONS}
    expert_options.setdefault("sufficient_factors", False)
    _scale_expert_grads(split)
    dp = split.groups.dp_group
    wrappers = []
    if dp is not None:
        for m in split.layers:
            wrappers.append(_ExpertsDDP(m.experts, group=dp, **expert_options))
            # Not a submodule: the model's state_dict and the outer wrapper keep seeing plain experts.
            object.__setattr__(m, "_expert_runner", wrappers[-1])
    ignored = set(getattr(model, "_ddp_params_and_buffers_to_ignore", ())) | split.expert_names
    model._ddp_params_and_buffers_to_ignore = ignored
    return MoEDistributedDataParallel(model, wrappers, group=split.groups.span, **ddp_options)


def moe_zero_optimizers(optimizer_class: type, model: torch.nn.Module, *, stage: int = 1,
                        options: ZeroOptions | None = None, **defaults):
    """``(dense, experts)`` optimizers for a model with :class:`MoE` layers under ZeRO stage 1 or 2:
    ``dense`` a :class:`ZeroOptimizer` of the dense parameters sharded over the span, ``experts`` one of the
    expert parameters sharded over the expert-data-parallel group (a plain ``optimizer_class`` when each
    expert has a single replica: nothing to average or shard). Expert gradients are scaled as the module
    doc says. Step and zero both, in the same order on every rank. ``options`` (its ``group`` and
    ``reducer`` must be unset: the helper sets the groups) and ``defaults`` go to both. The model is not
    wrapped (ZeRO's contract); its buffers are not broadcast. ``ValueError``: ``stage`` not 1 or 2,
    ``options`` with a group or reducer, and :func:`split_moe_params`'s errors."""
    if stage not in (1, 2):
        raise ValueError(f"moe_zero_optimizers supports ZeRO stages 1 and 2, got {stage!r}.")
    options = ZeroOptions() if options is None else options
    if options.group is not None or options.reducer is not None:
        raise ValueError("moe_zero_optimizers sets the groups itself: leave ZeroOptions.group and .reducer unset.")
    split = split_moe_params(model)
    _scale_expert_grads(split)
    dense = ZeroOptimizer(optimizer_class, split.dense, stage=stage,
                          options=dataclasses.replace(options, group=split.groups.span), **defaults)
    dp = split.groups.dp_group
    if dp is None:
        return dense, optimizer_class(split.experts, **defaults)
    experts = ZeroOptimizer(optimizer_class, split.experts, stage=stage,
                            options=dataclasses.replace(options, group=dp), **defaults)
    return dense, experts

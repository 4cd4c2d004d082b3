"""Averaging a model's state over a group, for the strategies that synchronise parameters instead of
gradients (:mod:`.local_sgd`, :mod:`.diloco`).

* trainable parameters and floating-point buffers (BatchNorm's running mean and variance): replaced by
  their group mean, one flat all-reduce (op AVG) per (dtype, device). Where the optimizer is a
  ``MasterWeights``, its float32 masters are averaged and copied into the low-precision model (averaging
  the model alone would be undone by the next step, which copies the masters back);
* other buffers (BatchNorm's ``num_batches_tracked``): replaced by the group's first rank's values.

An all-reduce leaves the same bits on every rank, so after :func:`average_module_` every rank holds
bitwise the same state. Every rank must call it with modules of the same structure, in the same order.
"""
from __future__ import annotations

import operator

import torch

from ringlet.types import ReduceOp

from ..comm import Comm
from .broadcast import broadcast_coalesced, coalesced_

__all__ = ["average_", "average_module_", "check_count", "copy_to_model_", "group_comm", "next_name", "split_buffers",
           "stepped", "trainable", "unwrap"]


def next_name(kind: str) -> str:
    """The name of one strategy's ops (coordinated mode matches ops by name). One per kind: every
    collective here is waited for before the call returns, so no two strategies' ops are in flight at once."""
    return f"ringlet.{kind}"


def average_(comm: Comm, tensors: list[torch.Tensor], name: str) -> None:
    """Replace each of ``tensors`` by its mean over ``comm``'s group (in place; one flat all-reduce per
    (dtype, device), all launched before any is waited for)."""
    coalesced_(tensors, name, lambda flat, n: comm.allreduce_(flat, ReduceOp.AVG, n))


def check_count(name: str, value, least: int) -> int:
    """``value`` as an int; ``ValueError`` unless it is an integer (not a bool) >= ``least``."""
    try:
        n = operator.index(value)
    except TypeError:
        n = None
    if n is None or isinstance(value, bool) or n < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return n


def trainable(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def split_buffers(module: torch.nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``(floating-point buffers, the others)``."""
    bufs = list(module.buffers())
    return [b for b in bufs if b.is_floating_point()], [b for b in bufs if not b.is_floating_point()]


def stepped(module: torch.nn.Module, optimizer) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """``(parameter, what the optimizer steps for it)`` for every trainable parameter: the float32 master
    where ``optimizer`` is a :class:`~.master_weights.MasterWeights` holding one (the masters are the
    weights; the model holds their rounded copies), else the parameter itself."""
    from .master_weights import MasterWeights

    masters = {id(p): m for p, m in optimizer.pairs} if isinstance(optimizer, MasterWeights) else {}
    return [(p, masters.get(id(p), p)) for p in trainable(module)]


@torch.no_grad()
def copy_to_model_(pairs: list[tuple[torch.nn.Parameter, torch.Tensor]]) -> None:
    """Write each master into its low-precision parameter (rounded); parameters without one are skipped."""
    for p, s in pairs:
        if s is not p:
            p.copy_(s)


def average_module_(comm: Comm, module: torch.nn.Module, name: str, optimizer=None) -> None:
    """Average ``module``'s trainable parameters (their masters, with a ``MasterWeights`` optimizer, then
    copied into the model) and floating buffers over the group; other buffers from the group's first rank
    (see the module doc). Nothing to do on a group of one."""
    if comm.size == 1:
        return
    pairs = stepped(module, optimizer)
    floats, others = split_buffers(module)
    average_(comm, [s for _, s in pairs] + floats, name)
    copy_to_model_(pairs)
    if others:
        broadcast_coalesced(comm, others, f"{name}.int")


def unwrap(model: torch.nn.Module):
    """``(module, ddp)``: a ringlet ``DistributedDataParallel``'s module and itself, or a plain module and
    None. ``TypeError`` for anything but a module."""
    from .ddp import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return model.module, model
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return model, None


def group_comm(module: torch.nn.Module, group, name: str, optimizer=None) -> Comm:
    """A :class:`Comm` of ``group`` (None: the world), after broadcasting ``module``'s parameters (the
    masters, with a ``MasterWeights`` optimizer) and buffers from the group's first rank over it, as DDP's
    construction does: every rank starts equal."""
    comm = Comm(group)
    if comm.size > 1:
        pairs = stepped(module, optimizer)
        frozen = [p.data for p in module.parameters() if not p.requires_grad]
        broadcast_coalesced(comm, [t.data for _, t in pairs] + frozen + list(module.buffers()), f"{name}.init")
        copy_to_model_(pairs)
    return comm

"""The gradient reductions of ``hvd.DistributedOptimizer(compression=<a ringlet Compressor>)``.

Horovod's ``Compression.none`` / ``Compression.fp16`` keep their meaning (cast before the all-reduce,
cast back after: :mod:`ringlet.torch.ordered_grads`). A :class:`ringlet.compression.Compressor` (or a name for
:func:`ringlet.compression.get`) instead sends each gradient, or each group of ``groups``, through
:meth:`ringlet.torch.comm.Comm.allreduce_compressed_`: payloads summed in float32, the compressor's
state kept per gradient (or group) between steps, the group's shapes handed to compressors with a
schedule of their own (PowerSGD).

Those reductions run on ringlet's core queue, which needs the same order on every rank, so they are not
matched by name: the *units* (a gradient, or a group) are launched in one fixed order, the reverse of
the optimizer's parameter order, by :class:`~ringlet.torch.ordered_grads.OrderedGradients`. The names
are still checked (a rank whose parameters differ gets a MismatchError naming the tensor).
"""
from __future__ import annotations

from typing import Callable

import torch

from .comm import Comm, CommFuture
from .ordered_grads import OrderedGradients

__all__ = ["CompressedGradients"]


class CompressedGradients(OrderedGradients):
    """One optimizer's compressed reductions (see the module doc). ``units``: lists of parameters in
    launch order; ``names``: parameter -> name; ``average``: Average (else Sum); ``predivide``: the
    gradient is divided by it before the reduction and multiplied after (``gradient_predivide_factor``)."""

    def __init__(self, comm: Comm, compressor, units: list[list[torch.Tensor]], names: dict, average: bool,
                 predivide: float = 1.0):
        super().__init__(units)
        self.comm, self.compressor = comm, compressor
        self.names = [names[u[0]] + (".group" if len(u) > 1 else "") for u in units]
        self.average, self.predivide = average, float(predivide)
        self.states: list[dict] = [{} for _ in units]

    def _launch(self, i: int, grad_of: Callable[[torch.Tensor], torch.Tensor]):
        params = self.units[i]
        grads = [grad_of(p) for p in params]
        for p, g in zip(params, grads):
            if g.is_sparse:
                raise ValueError(f"Parameter {self.names[i]!r} has a sparse gradient, which a ringlet compressor "
                                 "cannot reduce; use sparse_as_dense=True.")
        one = len(grads) == 1 and grads[0].is_contiguous()
        flat = grads[0].view(-1) if one else torch.cat([g.reshape(-1) for g in grads])
        if self.predivide != 1.0:
            flat.div_(self.predivide)
        fut = self.comm.allreduce_compressed_(flat, self.compressor, self.states[i], self.names[i],
                                              average=self.average, shapes=[tuple(p.shape) for p in params])
        return fut, flat, grads

    def _deliver(self, pending: tuple[CommFuture, torch.Tensor, list[torch.Tensor]]) -> None:
        fut, flat, grads = pending
        fut.wait()
        if self.predivide != 1.0:
            flat.mul_(self.predivide)
        if len(grads) == 1 and flat.data_ptr() == grads[0].data_ptr():
            return
        at = 0
        for g in grads:
            g.copy_(flat[at:at + g.numel()].view_as(g))
            at += g.numel()

"""Sufficient factors in :class:`~ringlet.torch.training.ddp.DistributedDataParallel`: the layers that
may be reduced from factors (:class:`FactorLayers`) and the reduction of one such weight
(:class:`FactorReduction`, one bucket per weight). The mathematics, the capture and the guard are in
:mod:`ringlet.torch.training.factors`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch

from . import factors as _factors
from .buckets import is_view_of, tensors_sharing

if TYPE_CHECKING:
    from ..comm import CommFuture
    from .buckets import Bucket
    from .reduction import ReductionContext, StepMarks

__all__ = ["FactorLayers", "FactorReduction", "reusable_out"]


class FactorLayers:
    """The ``nn.Linear`` layers whose weight may be reduced from factors, and the ones chosen.

    ``mode``: ``"on"`` and ``"auto"`` choose the eligible layers whose gathered factors are fewer numbers
    than their gradient (:func:`~ringlet.torch.training.factors.worth_factoring`); ``"auto"`` then puts
    them on trial against the dense reduction, ``"on"`` keeps them; ``"off"`` chooses none. The choice is made once, from rank 0's
    row counts (:meth:`wanted`, broadcast by the DDP, then :meth:`choose`); the capture hooks of layers
    not chosen are removed.
    """

    __slots__ = ("mode", "layers", "chosen")

    def __init__(self, module: torch.nn.Module, params: set[int], mode: str, allowed: bool):
        """``params``: ids of the parameters being reduced; ``allowed``: factors can be used at all
        (more than one rank, collectives on ringlet's core queue)."""
        self.mode = mode
        self.layers: list[_factors.FactoredLinear] = []
        if mode != "off" and allowed:
            self.layers = _factors.eligible_linears(module, params)
        self.chosen: dict[int, _factors.FactoredLinear] = {}  # id(weight) -> layer

    @property
    def on_trial(self) -> bool:
        """Whether the factors are to be timed against the dense reduction (``"auto"``)."""
        return self.mode == "auto" and bool(self.layers)

    def wanted(self, size: int) -> list[int]:
        """Per layer, 1 if it is worth factoring on ``size`` ranks by this rank's last row counts (a layer
        that saw no rows is not)."""
        return [int(_factors.worth_factoring(size, f.rows, f.out_features, f.in_features)) for f in self.layers]

    def choose(self, flags: list[int]) -> dict[int, _factors.FactoredLinear]:
        """Keep the layers flagged (in :meth:`wanted`'s order); the others stop capturing."""
        self.chosen = {id(f.weight): f for f, w in zip(self.layers, flags) if w}
        for f in self.layers:
            if id(f.weight) not in self.chosen:
                f.remove()  # no row counts needed any more
        self.layers = list(self.chosen.values())
        return self.chosen

    def enable(self) -> None:
        """Capture from this forward until each layer's reduction is launched."""
        for f in self.chosen.values():
            f.enabled = True

    def reset_capture(self) -> None:
        """Between steps, when the bucket sets switch: nothing captured so far counts."""
        for f in self.layers:
            f.enabled = False
            f.pairs.clear()

    def drop(self) -> None:
        """Factors lost their trial: no layer captures any more."""
        for f in self.layers:
            f.remove()
        self.chosen, self.layers = {}, []


class FactorReduction:
    """One fully connected layer's weight (the bucket's only parameter), averaged from every rank's
    gathered factors on ringlet's communication thread, the product on the factor worker
    (:func:`~ringlet.torch.training.factors.average_from_factors_async`); when some rank's factors do
    not reproduce its gradient, every rank all-reduces the dense gradient instead."""

    factored = True
    __slots__ = ("layer", "ctx", "grad", "result")

    def __init__(self, layer: _factors.FactoredLinear, ctx: ReductionContext):
        self.layer = layer
        self.ctx = ctx
        self.grad: torch.Tensor | None = None  # the local gradient of this backward
        self.result: tuple | None = None       # (average or None, used factors)

    def new_buffer(self, params: list[torch.nn.Parameter], numel: int) -> torch.Tensor:
        return torch.zeros(0, dtype=params[0].dtype, device=params[0].device)

    def prepare(self, b: Bucket) -> None:
        self.grad = self.result = None

    def accept(self, b: Bucket, j: int, grad: torch.Tensor | None) -> None:
        self.grad = grad  # checked against the factors on the comm thread

    def launch(self, b: Bucket, timed: bool) -> CommFuture:
        return self.ctx.comm.submit(self.stage(b), timed=timed)

    def stage(self, b: Bucket) -> Callable[[], Any]:
        """Take this backward's factors from the layer (the main thread, once backward reached the weight)
        and return the job that gathers them and starts the product (to run on the communication thread)."""
        layer, grad, pairs = self.layer, self.grad, self.layer.take_pairs()
        layer.enabled = False  # every pair of this window is in: backward reached the weight
        ctx = self.ctx
        comm, algo = ctx.comm, ctx.gather_algorithm
        out = self._reusable_out(b)  # decided here: backward is done with this weight
        name = ctx.name(b, "factors")

        def job():
            res = _factors.gather_factors(layer, grad, pairs, comm, name, algo)
            if res[0] != "factors":
                return res
            # The ranks that took part (one span each): the group's size now, also after an elastic reset.
            return "average", _factors.average_from_factors_async(res, layer.out_features, len(res[2]), out)

        return job

    def finish(self, b: Bucket, result: Any) -> None:
        # The product ran on the factor worker while backward went on: its future is done or nearly so.
        self.result = (result[1].result(), True) if result[0] == "average" else (result[1], False)

    def deliver(self, b: Bucket, marks: StepMarks) -> None:
        avg, used = self.result
        self.grad = self.result = None
        if used:
            self.ctx.factored += 1
        else:
            self.ctx.fallbacks += 1
            if self.ctx.fell_back is not None:
                self.ctx.fell_back(self.layer)
        if avg is None:
            return  # no rank had a gradient for it: leave .grad as it was, like torch
        if used:
            self.layer.out = avg
        self.give(b, avg, marks)

    def give(self, b: Bucket, avg: torch.Tensor, marks: StepMarks) -> None:
        """The weight's average into its ``.grad``: lent where ``.grad`` was None at the forward, else
        copied in (torch's DDP semantics)."""
        p = b.params[0]
        if marks.fresh[b.start] or p.grad is None:
            p.grad = avg.view_as(p)
        elif p.grad.data_ptr() != avg.data_ptr():
            p.grad.copy_(avg.view_as(p))

    def _reusable_out(self, b: Bucket) -> torch.Tensor | None:
        return reusable_out(self.layer, b.params[0].grad)


def reusable_out(layer: _factors.FactoredLinear, grad: torch.Tensor | None) -> torch.Tensor | None:
    """``layer``'s last average if nothing holds it any more but, possibly, the weight's ``.grad``
    (``grad``, about to be overwritten with the new average anyway)."""
    out = layer.out
    if out is None:
        return None
    refs = tensors_sharing(out)
    attached = 1 if grad is not None and is_view_of(grad, out) else 0
    return out if refs is not None and refs <= 1 + attached else None

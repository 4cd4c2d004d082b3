"""The gradient reductions of ``hvd.DistributedOptimizer(compression=<a ringlet Compressor>)``.

Horovod's ``Compression.none`` / ``Compression.fp16`` keep their meaning (cast before a name-matched
all-reduce, cast back after). A :class:`ringlet.compression.Compressor` (or a name for
:func:`ringlet.compression.get`) instead sends each gradient, or each group of ``groups``, through
:meth:`ringlet.torch.comm.Comm.allreduce_compressed_`: payloads summed in float32, the compressor's
state kept per gradient (or group) between steps, the group's shapes handed to compressors with a
schedule of their own (PowerSGD).

Those reductions run on ringlet's core queue, which needs the same order on every rank, so they are not
matched by name: the *units* (a gradient, or a group) are launched in one fixed order, the reverse of
the optimizer's parameter order (about the order backward produces them), each as soon as it and every
unit before it is ready; ``synchronize()`` launches the rest, gradients never produced as zeros. A unit
whose gradient comes late holds back the units after it. The names are still checked (a rank whose
parameters differ gets a MismatchError naming the tensor).
"""
from __future__ import annotations

from typing import Callable

import torch

from .comm import Comm, CommFuture

__all__ = ["CompressedGradients"]


class CompressedGradients:
    """One optimizer's compressed reductions (see the module doc). ``units``: lists of parameters in
    launch order; ``names``: parameter -> name; ``average``: Average (else Sum); ``predivide``: the
    gradient is divided by it before the reduction and multiplied after (``gradient_predivide_factor``)."""

    def __init__(self, comm: Comm, compressor, units: list[list[torch.Tensor]], names: dict, average: bool,
                 predivide: float = 1.0):
        self.comm, self.compressor = comm, compressor
        self.units = units
        self.unit_of = {p: i for i, u in enumerate(units) for p in u}
        self.names = [names[u[0]] + (".group" if len(u) > 1 else "") for u in units]
        self.average, self.predivide = average, float(predivide)
        self.states: list[dict] = [{} for _ in units]
        self._ready: list[set] = [set() for _ in units]
        self._pending: list[tuple[CommFuture, torch.Tensor, list[torch.Tensor]] | None] = [None] * len(units)
        self._next = 0

    def ready(self, p: torch.Tensor, grad_of: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """``p``'s gradient of this step is final: launch every unit, in order, that is now complete."""
        i = self.unit_of[p]
        self._ready[i].add(p)
        while self._next < len(self.units) and len(self._ready[self._next]) == len(self.units[self._next]):
            self._launch(self._next, grad_of)
            self._next += 1

    def finish(self, grad_of: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Launch what is left (``grad_of`` gives zeros for a gradient never produced), wait for every
        unit and leave the reduced gradients in ``.grad``; raises the first error after waiting for all."""
        while self._next < len(self.units):
            self._launch(self._next, grad_of)
            self._next += 1
        error = None
        for i, pending in enumerate(self._pending):
            try:
                self._deliver(*pending)
            except BaseException as exc:  # noqa: BLE001 - keep waiting so nothing is left in flight
                error = error or exc
        self.reset()
        if error is not None:
            raise error

    def reset(self) -> None:
        """Forget this step (the states stay)."""
        self._ready = [set() for _ in self.units]
        self._pending = [None] * len(self.units)
        self._next = 0

    def _launch(self, i: int, grad_of: Callable[[torch.Tensor], torch.Tensor]) -> None:
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
        self._pending[i] = (fut, flat, grads)

    def _deliver(self, fut: CommFuture, flat: torch.Tensor, grads: list[torch.Tensor]) -> None:
        fut.wait()
        if self.predivide != 1.0:
            flat.mul_(self.predivide)
        if len(grads) == 1 and flat.data_ptr() == grads[0].data_ptr():
            return
        at = 0
        for g in grads:
            g.copy_(flat[at:at + g.numel()].view_as(g))
            at += g.numel()

"""One unit of ZeRO stage 3: a bucket's persistent shard, its full buffer (allocated only while gathered)
and the module attributes its parameters are bound to.

The full buffer is the storage of ``flat``, a 1-D leaf tensor that requires grad and that no module
registers. Freeing resizes that storage to 0 bytes and gathering resizes it back, so the storage object
never changes: views of ``flat`` that autograd saved in a forward read the values gathered again before
their backward. The all-gather writes through ``flat.data`` — same storage, its own version counter — so
refilling the buffer does not count as an in-place change of the saved views. In a forward the module
attributes are views of ``flat`` (one ``split`` of it: the backward of the split concatenates the
parameters' gradients, zeros for those that got none, into one full-bucket gradient of ``flat``); in
``gathered()`` they are the original ``nn.Parameter`` objects whose ``data`` are views of a gathered copy;
otherwise they are :class:`~ringlet.torch.training.zero.placeholder.ShardedPlaceholder`. ``gathered()``
gathers into a fresh tensor (:meth:`Unit.gather_copy`), never into the forward buffer, so that what a
caller keeps from it (``state_dict()`` tensors) stays valid after the block.

States: FREE (no storage) → ISSUED (storage allocated, all-gather in flight) → READY (values complete)
→ FREE. A buffer is never freed while its all-gather is in flight.
"""
from __future__ import annotations

import torch

from .layout import Bucket
from .placeholder import ShardedPlaceholder

__all__ = ["Unit", "Binding"]

FREE, ISSUED, READY = "free", "issued", "ready"

Binding = tuple  # (module, attribute name, slot position in the unit)


class Unit:
    """Bucket ``bucket`` of the layout with this rank's block ``rank``; ``params[k]`` the original
    parameter of slot ``k``; ``bindings`` every (module, attribute, slot) that registers one of them.
    Construction copies this rank's block of the current values into the shard and releases the
    parameters' storage (their ``data`` become empty tensors)."""

    def __init__(self, bucket: Bucket, rank: int, params: list[torch.Tensor], bindings: list[Binding], name: str,
                 resolve=None):
        self.index = bucket.index
        self.name = name
        self.counts = tuple(bucket.counts)
        self.start, self.end = bucket.shard(rank)
        self.numel = bucket.numel
        self.sizes = [s.numel for s in bucket.slots]
        self.shapes = [s.shape for s in bucket.slots]
        self.offsets = [s.offset for s in bucket.slots]
        self.params = params
        self.bindings = bindings
        like = params[0]
        self.shard = torch.empty(self.end - self.start, dtype=like.dtype, device=like.device)
        for piece in bucket.pieces(rank):
            src = params[bucket.slots.index(piece.slot)].detach().reshape(-1)[piece.start:piece.end]
            self.shard[piece.shard_start:piece.shard_start + piece.numel].copy_(src)
        held = {s.index: 0 for s in bucket.slots}
        for piece in bucket.pieces(rank):
            held[piece.slot.index] += piece.numel
        self.placeholders = [ShardedPlaceholder(s.name, p, held[s.index], _resolver(resolve, self.index, k))
                             for k, (s, p) in enumerate(zip(bucket.slots, params))]
        self.current: list[torch.Tensor] | None = None
        self.flat = torch.empty(self.numel, dtype=like.dtype, device=like.device).requires_grad_(True)
        self.buf = self.flat.data
        self.nbytes = self.numel * self.flat.element_size()
        self.state = FREE
        self.future = None
        self.full: torch.Tensor | None = None
        self._release_storage()
        for p in params:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self.bind_placeholders()

    # ---- the buffer ---------------------------------------------------------------------------------
    def issue(self, reducer) -> None:
        """Allocate the buffer, put this rank's block in, start the all-gather."""
        assert self.state == FREE, (self.name, self.state)
        self.flat.untyped_storage().resize_(self.nbytes)
        self.buf[self.start:self.end].copy_(self.shard)
        self.future = reducer.allgather_(self.buf, self.counts, f"zero3/{self.index}:{self.name}")
        self.state = ISSUED

    def wait(self) -> None:
        """Block until the values are complete (raises the all-gather's error)."""
        if self.state == ISSUED:
            fut, self.future = self.future, None
            self.state = READY
            fut.wait()

    def free(self) -> None:
        """Wait for a gather in flight, then release the buffer and bind the placeholders."""
        try:
            self.wait()
        finally:
            self.flat.grad = None
            self._release_storage()
            self.state = FREE
            self.current = None
            self.bind_placeholders()

    def data_ptr(self) -> int:
        return self.buf.data_ptr() if self.state != FREE and self.nbytes else 0

    def _release_storage(self) -> None:
        self.flat.untyped_storage().resize_(0)

    # ---- what the modules hold ------------------------------------------------------------------------
    def views(self) -> list[torch.Tensor]:
        """The parameters as views of ``flat`` (with autograd history when grad mode is on)."""
        parts = torch.split(self.flat, self.sizes) if self.sizes else ()
        return [part.view(shape) for part, shape in zip(parts, self.shapes)]

    def bind_views(self) -> None:
        """Bind fresh views of ``flat`` (:meth:`views`); ``current`` holds them until freed."""
        self.current = self.views()
        self.bind(self.current)

    def bind(self, tensors) -> None:
        for module, attr, k in self.bindings:
            module._parameters[attr] = tensors[k]

    def bind_placeholders(self) -> None:
        self.bind(self.placeholders)

    # ---- full copies (gathered(), close()) -------------------------------------------------------------
    def gather_copy(self, reducer):
        """Start the all-gather of the bucket into a fresh tensor of its own (not the forward buffer):
        what a caller keeps from it stays valid, owned by reference count. Returns the future."""
        self.full = torch.empty(self.numel, dtype=self.shard.dtype, device=self.shard.device)
        self.full[self.start:self.end].copy_(self.shard)
        return reducer.allgather_(self.full, self.counts, f"zero3/{self.index}:{self.name}")

    def bind_originals(self) -> None:
        """The original parameters, their ``data`` views of the gathered copy."""
        for k, p in enumerate(self.params):
            p.data = self._part(k).view(self.shapes[k])
        self.bind(self.params)

    def write_back(self) -> None:
        """The shard takes this rank's block of what the original parameters hold now (written in place,
        or a same-shaped tensor assigned to ``p.data``)."""
        for k, p in enumerate(self.params):
            part = self._part(k)
            if p.data.data_ptr() != part.data_ptr() or p.data.numel() != part.numel():
                if tuple(p.shape) != tuple(self.shapes[k]):
                    raise ValueError(f"{self.placeholders[k]._zero_name}: shape {tuple(p.shape)} written inside "
                                     f"gathered(), expected {tuple(self.shapes[k])}")
                part.copy_(p.data.reshape(-1))
        self.shard.copy_(self.full[self.start:self.end])

    def drop_originals(self, keep: bool = False) -> None:
        """Let go of the gathered copy; ``keep``: the original parameters keep their views of it (their
        full values), else they become empty again."""
        for p in self.params:
            p.grad = None
            if not keep:
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self.full = None

    def _part(self, k: int) -> torch.Tensor:
        return self.full[self.offsets[k]:self.offsets[k] + self.sizes[k]]


def _resolver(resolve, unit: int, k: int):
    return None if resolve is None else (lambda: resolve(unit, k))

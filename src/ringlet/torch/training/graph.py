"""Which parameters a forward's output can give gradients to: the autograd graph walked from the
output (for ``find_unused_parameters``)."""
from __future__ import annotations

from typing import Any, Iterator

import torch

__all__ = ["params_reached"]


def _tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors_in(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors_in(x)
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            yield from _tensors_in(getattr(obj, name))


def params_reached(output: Any) -> set[int]:
    """ids of the leaf tensors the autograd graph of ``output`` (tensors in nested lists, tuples, dicts
    and dataclasses) accumulates gradients into."""
    seen: set = set()
    found: set[int] = set()
    stack = [t.grad_fn for t in _tensors_in(output) if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)  # AccumulateGrad nodes carry their leaf
        if var is not None:
            found.add(id(var))
        stack.extend(f for f, _ in fn.next_functions if f is not None)
    return found

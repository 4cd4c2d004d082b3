"""What a module holds in place of a parameter that ZeRO stage 3 has sharded, outside the forward and
backward of the module that owns it: a :class:`ShardedPlaceholder`.

A placeholder has the parameter's metadata (shape, dtype, device, ``requires_grad``; ``grad`` is None)
and no storage. Reading its metadata works, so ``module.named_parameters()``, ``print(module)`` and
``module.zero_grad()`` behave; anything that needs its values — arithmetic, ``print(p)``, ``p.data``,
``state_dict()``, ``load_state_dict()``, ``.to(...)``, pickling, ``copy.deepcopy`` — raises
:class:`ShardedParameterError`, whose message names the parameter, says how many of its elements this
rank holds, and how to read it (``with zero.gathered():``).

Stage 3 swaps the placeholders out of the modules while a module computes (forward and backward run on
gathered values) and inside ``gathered()``, so the error never fires there. A placeholder used inside a
forward all the same (a module reading another module's parameter) asks its ``resolve`` callable for the
gathered tensor it stands for and runs the operation on that.
"""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree

__all__ = ["ShardedPlaceholder", "ShardedParameterError"]


class ShardedParameterError(RuntimeError):
    """A stage-3 parameter was used outside the forward/backward of its module and outside
    ``gathered()``; the message says how to read it."""


# Metadata that a placeholder answers (properties and methods of torch.Tensor that read no values).
_PROPERTIES = frozenset({
    "shape", "dtype", "device", "requires_grad", "grad", "is_leaf", "layout", "ndim", "is_sparse", "is_cuda",
    "is_meta", "is_quantized", "is_nested", "is_mkldnn", "is_cpu", "is_mps", "is_xpu", "_grad", "grad_fn",
    "_backward_hooks", "_post_accumulate_grad_hooks", "names", "is_xla", "is_ipu", "is_mtia", "_is_view",
})
_METHODS = frozenset({
    "size", "dim", "numel", "nelement", "element_size", "is_floating_point", "is_complex", "__hash__",
    "__len__", "_is_view", "get_device", "ndimension",
})


class ShardedPlaceholder(torch.Tensor):
    """Stands in a module for the sharded parameter ``name`` (``held`` of its ``numel`` elements on
    this rank). Setting its ``grad`` to None is allowed (``zero_grad``); see the module doc."""

    @staticmethod
    def __new__(cls, name: str, like: torch.Tensor, held: int, resolve=None):
        t = torch.Tensor._make_wrapper_subclass(cls, tuple(like.shape), dtype=like.dtype, device=like.device,
                                                requires_grad=like.requires_grad)
        t._zero_name = name
        t._zero_held = held
        t._zero_resolve = resolve
        return t

    def __init__(self, name: str, like: torch.Tensor, held: int, resolve=None):
        pass

    def message(self) -> str:
        numel = 1
        for s in self.shape:
            numel *= s
        return (f"{self._zero_name} is sharded by ZeRO stage 3 (this rank holds {self._zero_held} of {numel} "
                f"elements): it has no values outside the forward and backward of the module that owns it. "
                f"Read it inside `with zero.gathered():` (`zero.gathered(writeback=True)` to change it), "
                f"or use it by calling its module.")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _allowed(func, args):
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        args, kwargs = pytree.tree_map_only(ShardedPlaceholder, _resolved, (args, kwargs))
        return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise ShardedParameterError(_first(args, kwargs).message())


def _allowed(func, args) -> bool:
    name = getattr(func, "__name__", "")
    if name == "__get__":
        return getattr(getattr(func, "__self__", None), "__name__", "") in _PROPERTIES
    if name == "__set__":  # only `p.grad = None`
        prop = getattr(getattr(func, "__self__", None), "__name__", "")
        return prop in ("grad", "_grad") and len(args) > 1 and args[-1] is None
    return name in _METHODS


def _resolved(ph: ShardedPlaceholder) -> torch.Tensor:
    real = ph._zero_resolve() if ph._zero_resolve is not None else None
    if real is None:
        raise ShardedParameterError(ph.message())
    return real


def _first(args, kwargs) -> ShardedPlaceholder:
    for a in list(args) + list((kwargs or {}).values()):
        if isinstance(a, ShardedPlaceholder):
            return a
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, ShardedPlaceholder):
                    return b
    raise ShardedParameterError("a parameter sharded by ZeRO stage 3 was used outside its module's forward; "
                                "read it inside `with zero.gathered():`")

"""Start-of-training helpers of ``ringlet.torch``: make every rank begin from the root's model and
optimizer, and move arbitrary picklable objects between ranks.

Objects are serialised with cloudpickle when it is installed (lambdas, local classes) and with the
standard pickle otherwise, then travel as uint8 tensors through :mod:`.mpi_ops`.
"""
from __future__ import annotations

import io

import torch

from . import mpi_ops
from .basics import rank as _global_rank
from .process_sets import global_process_set

try:
    import cloudpickle as _pickler
except ImportError:  # cloudpickle is optional; plain pickle covers module-level objects
    import pickle as _pickler


def _dumps(obj) -> torch.Tensor:
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _loads(t: torch.Tensor):
    return _pickler.loads(t.numpy().tobytes())


def _sub(name, suffix):
    return None if name is None else f"{name}.{suffix}"


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrite ``params`` in place with global rank ``root_rank``'s values.

    ``params``: a dict name -> tensor (e.g. ``model.state_dict()``; broadcast in sorted key order and
    under the keys as op names), or a list of tensors or of ``(name, tensor)`` pairs (e.g.
    ``model.named_parameters()`` turned into a list). Anything else raises ``ValueError``. Returns when
    every tensor has arrived.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}; expected a dict or a list of tensors "
                         "or of (name, tensor) pairs.")
    handles = []
    for name, p in items:
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"broadcast_parameters: entry {name!r} is a {type(p).__name__}, not a tensor.")
        # detach(): same storage, but the in-place write is not an autograd op on a leaf.
        handles.append(mpi_ops.broadcast_async_(p.detach(), root_rank, name=name, process_set=process_set))
    for h in handles:
        mpi_ops.synchronize(h)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Return global rank ``root_rank``'s ``obj`` on every member of ``process_set`` (other ranks' ``obj``
    is ignored; pass ``None``). Any picklable object; the root gets its own object back."""
    me = _global_rank()
    if me == root_rank:
        payload = _dumps(obj)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        payload = None
        length = torch.zeros(1, dtype=torch.int64)
    mpi_ops.broadcast_(length, root_rank, name=_sub(name, "size"), process_set=process_set)
    if payload is None:
        payload = torch.empty(int(length[0]), dtype=torch.uint8)
    mpi_ops.broadcast_(payload, root_rank, name=_sub(name, "data"), process_set=process_set)
    return obj if me == root_rank else _loads(payload)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Return the list of every member's ``obj``, in rank order (any picklable objects)."""
    payload = _dumps(obj)
    sizes = mpi_ops.allgather(torch.tensor([payload.numel()], dtype=torch.int64), name=_sub(name, "size"),
                              process_set=process_set)
    data = mpi_ops.allgather(payload, name=_sub(name, "data"), process_set=process_set)
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(_loads(data[offset:offset + n]))
        offset += n
    return out


def _zero_grad_like(p: torch.Tensor, sparse: bool) -> torch.Tensor:
    z = torch.zeros_like(p, memory_format=torch.contiguous_format)
    return z.to_sparse(1) if sparse and p.dim() > 0 else z


def _initialise_state(optimizer) -> None:
    """Give an optimizer with empty state its state: every parameter that requires grad gets a zero
    gradient (sparse for ``SparseAdam``) and one step of the base class runs. The parameters are then put
    back to their values before the step (weight decay and similar terms move them even with zero
    gradients); the zero gradients stay, as in Horovod."""
    sparse = isinstance(optimizer, torch.optim.SparseAdam)
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    with torch.no_grad():
        saved = [p.detach().clone() for p in params]
    for p in params:
        p.grad = _zero_grad_like(p, sparse)
    # A DistributedOptimizer's own step() would start collectives; its base class's step only updates.
    step = getattr(type(optimizer), "_ringlet_base_step", None)
    if step is not None:
        step(optimizer)
    else:
        optimizer.step()
    with torch.no_grad():
        for p, value in zip(params, saved):
            p.copy_(value)


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Make every rank's optimizer state (per-parameter state and every param group's options) equal to
    global rank ``root_rank``'s.

    An optimizer whose state is still empty (on any rank, the root included) is first initialised as in
    Horovod: each parameter that requires grad gets a zero ``.grad`` (left in place afterwards; sparse
    for ``SparseAdam``; parameters that do not require grad keep theirs) and one step of the base class
    runs; parameters keep their values. Afterwards each parameter's state holds exactly the root's keys:
    tensor state travels by in-place broadcasts, options and scalar state (learning rate, step counts,
    ...) as one object. ``torch.optim.LBFGS`` keeps state that cannot be rebuilt this way: ``ValueError``.
    Ranks with different numbers of parameters or groups: ``ValueError``. ``model`` is accepted for
    compatibility and not needed.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if len(optimizer.state) == 0:
        _initialise_state(optimizer)

    params = [p for group in optimizer.param_groups for p in group["params"]]
    # The root's layout drives everyone: ranks whose state differs in shape or keys still end equal.
    layout = None
    if _global_rank() == root_rank:
        layout = {
            "options": [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups],
            "state": [_describe_state(optimizer.state[p]) if p in optimizer.state else None for p in params],
        }
    layout = broadcast_object(layout, root_rank, name="optimizer_state.layout", process_set=process_set)
    if len(layout["state"]) != len(params) or len(layout["options"]) != len(optimizer.param_groups):
        raise ValueError(f"broadcast_optimizer_state: rank {root_rank} has {len(layout['state'])} parameters in "
                         f"{len(layout['options'])} groups, this rank {len(params)} in "
                         f"{len(optimizer.param_groups)}.")
    for group, options in zip(optimizer.param_groups, layout["options"]):
        group.update(options)
    handles = [h for i, (p, desc) in enumerate(zip(params, layout["state"]))
               for h in _receive_state(optimizer, i, p, desc, root_rank, process_set)]
    for h in handles:
        mpi_ops.synchronize(h)


def _receive_state(optimizer, i: int, p, desc, root_rank, process_set) -> list[int]:
    """Replace parameter ``p``'s state by the root's keys (``desc``; None: no state) and start the
    broadcasts of its tensors into it; returns their handles."""
    if desc is None:
        optimizer.state.pop(p, None)
        return []
    old, state, handles = optimizer.state.get(p, {}), {}, []
    for key, kind, value in desc:
        if kind == "tensor":
            shape, dtype = value
            t = old.get(key)
            if not isinstance(t, torch.Tensor) or t.shape != shape or t.dtype != dtype:
                t = torch.zeros(shape, dtype=dtype, device=p.device)
            state[key] = t
            handles.append(mpi_ops.broadcast_async_(t, root_rank, name=f"optimizer_state.{i}.{key}",
                                                    process_set=process_set))
        elif kind == "scalar_tensor":
            state[key] = value.clone()
        else:
            state[key] = value
    optimizer.state[p] = state
    return handles


def _describe_state(state: dict) -> list:
    out = []
    for key in sorted(state, key=str):
        v = state[key]
        if isinstance(v, torch.Tensor) and v.dim() > 0 and not v.is_sparse and v.dtype in mpi_ops._MOVE_DTYPES:
            out.append((key, "tensor", (v.shape, v.dtype)))
        elif isinstance(v, torch.Tensor):
            out.append((key, "scalar_tensor", v.detach().clone()))
        else:
            out.append((key, "object", v))
    return out


__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object"]

"""One process turns a sharded checkpoint into ordinary state: the model's ``state_dict`` and the
optimizer's state by parameter name — and, from there, into a ``torch.optim`` optimizer of the unsharded
model (:func:`load_into_torch_optimizer`)."""
from __future__ import annotations

import math

import torch

from .checkpoint_fetch import Fetcher, Index, load_common
from .checkpoint_files import Manifest

__all__ = ["consolidate", "load_into_torch_optimizer"]


def consolidate(path) -> dict:
    """Every parameter's pieces stitched together. The result:

    * ``"model"``: the model's ``state_dict`` (keys in the saved module's order; parameters in the model
      dtype, cast from the float32 masters; buffers and frozen parameters as saved; tied parameters under
      every key). Saved without a module: the trainable parameters only.
    * ``"optimizer"``: ``{"state": {name: {key: value}}, "param_groups": [{hyperparameters...,
      "params": [names]}]}`` — per-element state (``exp_avg``...) in the parameter's shape, float32 as the
      shards keep it; per-parameter scalars (``step``) as saved. A parameter without state (never
      stepped, or without elements) has none.
    * ``"master"``: ``{name: float32 master values in the parameter's shape}``.
    * ``"extra"``: the ``extra`` given to the save; ``"meta"``: ``{"stage", "world", "zero_extra"}``.

    ``FileNotFoundError`` / ``IncompleteCheckpoint`` as for loading."""
    manifest = Manifest.read(path)
    common = load_common(manifest)
    index = Index(manifest, common)
    masters, states = {}, {}
    with Fetcher(manifest, index, common) as fetch:
        for name, (shape, _, _) in index.params.items():
            master, state = fetch(name, 0, index.numel(name))
            masters[name] = master.reshape(shape)
            if state:
                states[name] = {k: _shaped(v, shape) for k, v in state.items()}
    return {"model": _model(index, masters, common.get("module")), "master": masters,
            "optimizer": {"state": states, "param_groups": _groups(index, common)},
            "extra": common.get("extra"),
            "meta": {"stage": manifest.stage, "world": manifest.world, "zero_extra": common.get("zero_extra")}}


def _shaped(value, shape):
    if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == math.prod(shape):
        return value.reshape(shape)
    return value


def _model(index: Index, masters: dict, module: dict | None) -> dict:
    def param(name):
        return masters[name].to(index.params[name][1])

    if module is None:
        return {name: param(name) for name in index.params}
    out = {}
    for key in module["keys"]:
        if key in module["state"]:
            out[key] = module["state"][key]
        elif key in module["aliases"]:
            out[key] = param(module["aliases"][key])
        else:
            out[key] = param(key)
    return out


def _order(index: Index, common: dict) -> list[str]:
    module = common.get("module")
    names = list(module["params"]) if module else []
    return names + [n for n in index.params if n not in set(names)]


def _groups(index: Index, common: dict) -> list[dict]:
    groups = [{**g, "params": []} for g in common.get("groups", [])]
    for name in _order(index, common):
        g = index.params[name][2]
        if 0 <= g < len(groups):
            groups[g]["params"].append(name)
    return groups


def load_into_torch_optimizer(consolidated: dict, optimizer: torch.optim.Optimizer,
                              module: torch.nn.Module) -> None:
    """Load ``consolidated["optimizer"]`` into ``optimizer``, a ``torch.optim`` optimizer built over
    ``module``'s parameters (the unsharded model) with as many param groups as the checkpoint: its
    parameters are matched by name, the groups' hyperparameters replaced by the saved ones. ``ValueError``
    when the group counts differ or a parameter of ``optimizer`` is not one of ``module``'s."""
    names = {id(p): n for n, p in module.named_parameters()}
    saved = consolidated["optimizer"]
    if len(saved["param_groups"]) != len(optimizer.param_groups):
        raise ValueError(f"the checkpoint has {len(saved['param_groups'])} param groups, the optimizer "
                         f"{len(optimizer.param_groups)}")
    state, groups, at = {}, [], 0
    for group, hyper in zip(optimizer.param_groups, saved["param_groups"]):
        ids = []
        for p in group["params"]:
            if id(p) not in names:
                raise ValueError("the optimizer holds a parameter that is not one of the module's")
            if names[id(p)] in saved["state"]:
                state[at] = saved["state"][names[id(p)]]
            ids.append(at)
            at += 1
        groups.append({**{k: v for k, v in hyper.items() if k != "params"}, "params": ids})
    optimizer.load_state_dict({"state": state, "param_groups": groups})

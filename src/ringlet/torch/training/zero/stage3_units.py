"""Which parameters form ZeRO stage 3's units, and which module attributes hold each bucket's parameters.

:func:`units_of` is the default rule (see its doc); :func:`where_of` and :func:`bindings_of` read a
layout back: the bucket of every parameter, every (module, attribute, slot) registering one, and the
buckets each module needs.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .layout import Layout

__all__ = ["units_of", "where_of", "bindings_of", "unit_name"]


def units_of(module: torch.nn.Module, named: Sequence[tuple[str, torch.Tensor]],
             groups: Sequence[int] | None = None) -> list[list[int]]:
    """The units of ``module`` for ZeRO stage 3, as indices into ``named`` (its trainable parameters):
    every module (``named_modules()`` order) that directly registers parameters of ``named`` is one unit
    of those, in registration order; a parameter registered by several modules belongs to the first.
    ``groups`` (``groups[i]``: the optimizer param group of ``named[i]``): a unit whose parameters differ
    in dtype or group is split by them, keeping the order (a layout bucket holds one of each).
    ``ValueError`` when ``named`` lists a parameter twice or one that ``module`` does not register."""
    index: dict[int, int] = {}
    for i, (name, p) in enumerate(named):
        if id(p) in index:
            raise ValueError(f"{name} is listed twice (also as {named[index[id(p)]][0]})")
        index[id(p)] = i
    units, assigned = [], set()
    for _, m in module.named_modules():
        unit = []
        for p in m._parameters.values():
            i = index.get(id(p)) if p is not None else None
            if i is not None and i not in assigned:
                assigned.add(i)
                unit.append(i)
        if unit:
            units.extend(_split(unit, named, groups))
    missing = [named[i][0] for i in range(len(named)) if i not in assigned]
    if missing:
        raise ValueError(f"not parameters of the module: {missing}")
    return units


def _split(unit: list[int], named, groups) -> list[list[int]]:
    parts: dict[tuple, list[int]] = {}
    for i in unit:
        parts.setdefault((named[i][1].dtype, groups[i] if groups is not None else 0), []).append(i)
    return list(parts.values())


def where_of(layout: Layout, n: int) -> dict[int, int]:
    where: dict[int, int] = {}
    for bucket in layout.buckets:
        for s in bucket.slots:
            if s.index in where or not 0 <= s.index < n:
                raise ValueError(f"the layout holds parameter {s.name} (index {s.index}) twice or out of range")
            where[s.index] = bucket.index
    if len(where) != n:
        raise ValueError(f"the layout holds {len(where)} of the {n} parameters")
    return where


def bindings_of(module: torch.nn.Module, named, layout: Layout, where: dict[int, int]):
    """Every (module, attribute, slot) registering a parameter of ``named``, per bucket; and the buckets
    each such module needs (by module id, sorted)."""
    index = {id(p): i for i, (_, p) in enumerate(named)}
    position = {s.index: k for bucket in layout.buckets for k, s in enumerate(bucket.slots)}
    bindings: dict[int, list] = {bucket.index: [] for bucket in layout.buckets}
    needs: dict[int, set[int]] = {}
    found = set()
    for m in module.modules():
        for attr, p in m._parameters.items():
            i = index.get(id(p)) if p is not None else None
            if i is None:
                continue
            found.add(i)
            b = where[i]
            bindings[b].append((m, attr, position[i]))
            needs.setdefault(id(m), set()).add(b)
    missing = [named[i][0] for i in range(len(named)) if i not in found]
    if missing:
        raise ValueError(f"not parameters of the module: {missing}")
    return bindings, {k: tuple(sorted(v)) for k, v in needs.items()}


def unit_name(bucket) -> str:
    first = bucket.slots[0].name
    return first.rpartition(".")[0] or first

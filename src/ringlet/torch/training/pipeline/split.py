"""Cutting an ``nn.Sequential`` into contiguous stages: the layer counts per stage (``balance``, given or
even by parameter count) and each stage's part as a Sequential that keeps the original layer names."""
from __future__ import annotations

from collections import OrderedDict

import torch

__all__ = ["check_balance", "even_balance", "layer_ranges", "stage_module"]


def check_balance(balance, layers: int, stages: int) -> list[int]:
    """``balance`` (layers per stage, as torchgpipe's) as a list: ``stages`` positive ints summing to
    ``layers``; ``ValueError`` otherwise."""
    try:
        counts = [int(b) for b in balance]
    except (TypeError, ValueError):
        raise ValueError(f"balance must be a list of layer counts per stage, got {balance!r}.") from None
    if any(isinstance(b, bool) or int(b) != b for b in balance):
        raise ValueError(f"balance must hold ints, got {list(balance)!r}.")
    if len(counts) != stages:
        raise ValueError(f"balance has {len(counts)} entries for {stages} stages.")
    if any(c < 1 for c in counts):
        raise ValueError(f"every stage needs at least one layer; balance {counts} has an empty stage.")
    if sum(counts) != layers:
        raise ValueError(f"balance {counts} sums to {sum(counts)} layers, but the Sequential has {layers}.")
    return counts


def even_balance(sizes: list[int], stages: int) -> list[int]:
    """Layers per stage for layers of ``sizes`` parameters: the contiguous cut whose largest stage has the
    fewest parameters, each stage at least one layer; among such cuts, each stage takes as many layers as
    it can (so a parameter-free layer such as an activation stays with the layer before it). Without any
    parameter the layers are spread evenly by count."""
    n = len(sizes)
    if not any(sizes):
        return [n // stages + (1 if s < n % stages else 0) for s in range(stages)]
    prefix = [0]
    for x in sizes:
        prefix.append(prefix[-1] + x)
    bound = _min_max_part(prefix, stages)
    counts, lo = [], 0
    for s in range(stages):
        left = stages - s - 1
        hi = next(h for h in range(n - left, lo, -1)
                  if prefix[h] - prefix[lo] <= bound and _fits(prefix, h, left, bound))
        counts.append(hi - lo)
        lo = hi
    return counts


def _fits(prefix: list[int], start: int, parts: int, bound: int) -> bool:
    """Whether layers ``start..`` split into exactly ``parts`` non-empty parts of at most ``bound``
    parameters: no fewer layers than parts, and the greedy cut (each part as long as it can be) needs
    at most ``parts`` (cutting a part further never makes one larger)."""
    n = len(prefix) - 1
    if n - start < parts or (parts == 0) != (start == n):
        return False
    lo, used = start, 0
    while lo < n:
        if prefix[lo + 1] - prefix[lo] > bound:
            return False
        hi = lo + 1
        while hi < n and prefix[hi + 1] - prefix[lo] <= bound:
            hi += 1
        used, lo = used + 1, hi
    return used <= parts


def _min_max_part(prefix: list[int], stages: int) -> int:
    """The smallest bound on a stage's parameters for which a cut into ``stages`` parts exists."""
    lo, hi = 0, prefix[-1]
    while lo < hi:
        mid = (lo + hi) // 2
        if _fits(prefix, 0, stages, mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def layer_ranges(counts: list[int]) -> list[tuple[int, int]]:
    """``[(first, end), ...]`` layer index ranges of each stage."""
    out, lo = [], 0
    for c in counts:
        out.append((lo, lo + c))
        lo += c
    return out


def stage_module(module: torch.nn.Sequential, lo: int, hi: int) -> torch.nn.Sequential:
    """Layers ``lo..hi-1`` of ``module`` (the same layer objects) as a Sequential whose children keep their
    names in ``module``, so its ``state_dict`` keys are those of the whole model."""
    named = list(module.named_children())[lo:hi]
    return torch.nn.Sequential(OrderedDict(named))

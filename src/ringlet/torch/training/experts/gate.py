"""Top-k gating with a capacity per expert: which token goes to which expert, with what weight, which
assignments are dropped, and Switch's load-balancing loss.

Contract of :func:`route` (logits ``[T, E]`` of ``T`` tokens over ``E`` experts):

* probabilities ``softmax(logits)`` in float32; each token picks its ``k`` most probable experts
  (``torch.topk``: ties go to the lower index). k=1 weights the chosen expert's output by its
  probability (Switch); k=2 by the two probabilities renormalised to sum to 1 (GShard), computed before
  any drop: an assignment dropped for capacity contributes zero and the other keeps its weight;
* capacity: each expert takes at most ``capacity`` of this rank's assignments (None: no limit). Slots are
  filled in priority order: every token's first choice in token order, then every token's second choice
  (GShard's order: a first choice never loses its slot to another token's second choice);
* the load-balancing loss is Switch's ``E * sum_i f_i * P_i``: ``f_i`` the fraction of the tokens whose
  first choice is expert ``i`` (before capacity; not differentiable), ``P_i`` the mean probability of
  expert ``i`` over the tokens (differentiable: the gate learns from it). It is 1 for a uniform router
  and ``E`` when every token picks one expert with certainty. Zero tokens give a zero loss.
"""
from __future__ import annotations

import dataclasses
import math

import torch

__all__ = ["Routing", "capacity", "route"]


@dataclasses.dataclass
class Routing:
    """The kept assignments, sorted by expert (ties: priority order), and the step's counts.

    ``expert``/``token``: ``[N]`` int64, expert and token of each kept assignment; ``weight``: ``[N]``
    float32 combine weights (differentiable through the gate); ``counts``: ``[E]`` int64 kept assignments
    per expert; ``load``: ``[E]`` int64 assignments routed to each expert before capacity; ``dropped``:
    assignments beyond capacity; ``dropped_tokens``: tokens none of whose assignments was kept;
    ``aux_loss``: the load-balancing loss (float32 scalar)."""

    expert: torch.Tensor
    token: torch.Tensor
    weight: torch.Tensor
    counts: torch.Tensor
    load: torch.Tensor
    dropped: int
    dropped_tokens: int
    aux_loss: torch.Tensor


def capacity(tokens: int, num_experts: int, k: int, capacity_factor: float, min_capacity: int) -> int:
    """Slots per expert for ``tokens`` tokens: ``ceil(capacity_factor * tokens * k / num_experts)``, at
    least ``min_capacity``."""
    return max(int(min_capacity), math.ceil(capacity_factor * tokens * k / num_experts))


def route(logits: torch.Tensor, k: int, cap: int | None) -> Routing:
    """Route the ``[T, E]`` ``logits`` to the top-``k`` experts with ``cap`` slots per expert (None: no
    limit); see the module doc."""
    tokens, experts = logits.shape
    probs = torch.softmax(logits.float(), dim=-1)
    top_p, top_i = probs.topk(k, dim=-1)
    weights = top_p if k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)
    # Assignments in priority order: all first choices (token order), then all second choices.
    expert = top_i.t().reshape(-1)
    weight = weights.t().reshape(-1)
    token = torch.arange(tokens, dtype=torch.int64, device=logits.device).repeat(k)
    load = torch.bincount(expert, minlength=experts)
    order = torch.sort(expert, stable=True).indices
    start = torch.cumsum(load, 0) - load
    slot = torch.arange(expert.numel(), dtype=torch.int64, device=logits.device) - start[expert[order]]
    kept = order if cap is None else order[slot < cap]
    counts = load if cap is None else torch.clamp(load, max=cap)
    per_token = torch.bincount(token[kept], minlength=tokens)
    first = torch.bincount(top_i[:, 0], minlength=experts).float() / max(tokens, 1)
    aux = experts * torch.sum(first * probs.sum(dim=0) / max(tokens, 1))
    return Routing(expert=expert[kept], token=token[kept], weight=weight[kept], counts=counts, load=load,
                   dropped=int(expert.numel() - kept.numel()), dropped_tokens=int((per_token == 0).sum()),
                   aux_loss=aux)

"""``ringlet.torch.MoE``: a mixture-of-experts layer whose experts are spread over the ranks of an
expert-parallel group, tokens travelling to them and back by all-to-all.

Forward of ``x`` (``[..., hidden_size]``, ``T`` tokens on this rank):

1. ``gate`` (``nn.Linear(hidden_size, num_experts)``) scores every token; :func:`.gate.route` picks the
   top-``k`` experts, the weights, the capacity drops and the load-balancing loss;
2. the kept rows, sorted by expert, go to the ranks holding their experts (:mod:`.dispatch`: counts first,
   then the rows, unpadded);
3. each local expert runs once on all its received rows (an empty batch when none came, so every rank
   builds the same autograd graph);
4. the outputs return by the reverse all-to-all and are summed per token, weighted.

Returns ``(output, aux_loss)``: ``output`` has ``x``'s shape; a token none of whose assignments was kept
gets zeros (put the layer inside a residual connection, as Switch and GShard do, to pass it through);
``aux_loss`` is this rank's load-balancing loss (add ``coef * aux_loss`` to the loss; 0.01 is usual).
Gradients: the gate through the combine weights and the aux loss, each expert through the rows it
received, whichever rank they came from. Without a wrapper an expert's ``.grad`` is the gradient of the
sum of the losses of its expert-parallel group's ranks; :func:`ringlet.torch.moe_parallel` turns it into
the gradient of the mean loss over all ranks.
"""
from __future__ import annotations

import copy

import torch

from ringlet.group import Group

from .dispatch import all_to_all, exchange_counts, run_by_expert
from .gate import capacity, route
from .groups import expert_groups

__all__ = ["MoE", "LocalExperts"]


class LocalExperts(torch.nn.ModuleList):
    """This rank's experts; called with one batch of rows per expert, returns their outputs."""

    def forward(self, chunks: list[torch.Tensor]) -> list[torch.Tensor]:
        return [expert(chunk) for expert, chunk in zip(self, chunks)]


class MoE(torch.nn.Module):
    """Mixture of experts (module doc). ``expert``: the module every expert is a deep copy of, mapping
    ``[n, hidden_size]`` to ``[n, hidden_size]``. ``num_experts``: experts in all; ``ep_size``: ranks
    they are spread over (default the size of ``group``, the world by default; 1 without ringlet
    initialised), each rank holding ``num_experts / ep_size`` of them in :attr:`experts` (global index
    ``ep_rank * local + i``). ``k``: 1 (Switch) or 2 (GShard). ``capacity_factor``, ``min_capacity``:
    slots per expert ``max(min_capacity, ceil(capacity_factor * tokens * k / num_experts))`` for this
    rank's ``tokens``; ``drop_tokens=False``: no limit. ``group``: the :class:`ringlet.Group` the layer
    spans (None: the world); ranks outside it call :func:`~.groups.expert_groups` instead of constructing
    the layer (the groups are created on every rank in the same order).

    ``seed`` (default 0): each expert is initialised afresh from a generator seeded by ``seed`` and its
    global index, the gate from ``seed`` alone: in every submodule that holds a matrix (a parameter of two
    or more dimensions: ``Linear``, ``Conv``, ``Embedding``), all its floating parameters are drawn uniform
    in ``±1/sqrt(fan_in)`` of its first matrix (exactly the distribution of torch's default ``Linear`` and
    ``Conv`` initialisation); submodules holding only vectors (norms) keep ``expert``'s values (torch's
    constants unless changed). No global random state is read or changed, so every rank builds the same
    experts and gate for the same seed, and a single-process model with ``ep_size=1`` holds the same
    weights. ``seed=None``: plain deep copies (identical experts) and a default-initialised gate: the
    caller initialises them.

    :attr:`stats` after each forward: ``tokens``, ``capacity`` (None without a limit), ``dropped``
    (assignments beyond capacity), ``dropped_tokens`` (tokens with no kept assignment), ``load`` (per
    global expert: assignments routed to it by this rank, before capacity).

    ``ValueError``: a bad argument (``ep_size`` not dividing the group, ``num_experts`` not divisible by
    ``ep_size``, ``k`` not 1 or 2 or above ``num_experts``, ...) or an input whose last dimension is
    not ``hidden_size``.
    """

    def __init__(self, hidden_size: int, expert: torch.nn.Module, num_experts: int, ep_size: int | None = None,
                 k: int = 1, capacity_factor: float = 1.25, min_capacity: int = 4, drop_tokens: bool = True,
                 group: Group | None = None, seed: int | None = 0):
        super().__init__()
        _check_args(hidden_size, expert, num_experts, k, capacity_factor, min_capacity)
        self.groups = expert_groups(ep_size, group)
        if self.groups is None:
            raise ValueError(f"This rank is not a member of the MoE layer's group (ranks {list(group.ranks)}); "
                             "ranks outside it call ringlet.torch.training.experts.expert_groups(ep_size, group).")
        ep = self.groups.ep_size
        if num_experts % ep:
            raise ValueError(f"num_experts ({num_experts}) must be divisible by ep_size ({ep}).")
        self.hidden_size, self.num_experts, self.k = hidden_size, num_experts, k
        self.capacity_factor, self.min_capacity, self.drop_tokens = float(capacity_factor), min_capacity, drop_tokens
        self.num_local = num_experts // ep
        self.gate = torch.nn.Linear(hidden_size, num_experts)
        first = self.groups.ep_rank * self.num_local
        self.experts = LocalExperts(copy.deepcopy(expert) for _ in range(self.num_local))
        if seed is not None:
            _seeded_init(self.gate, _generator(seed, -1))
            for i, e in enumerate(self.experts):
                _seeded_init(e, _generator(seed, first + i))
        self._expert_runner = None  # set by moe_parallel: the experts under their own data-parallel wrapper
        self.stats: dict = {}

    @property
    def ep_size(self) -> int:
        return self.groups.ep_size

    @property
    def ep_rank(self) -> int:
        return self.groups.ep_rank

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dim() == 0 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"MoE expects inputs [..., {self.hidden_size}], got {tuple(x.shape)}.")
        rows = x.reshape(-1, self.hidden_size)
        tokens = rows.shape[0]
        cap = capacity(tokens, self.num_experts, self.k, self.capacity_factor, self.min_capacity) \
            if self.drop_tokens else None
        r = route(self.gate(rows), self.k, cap)
        out_rows = self._experts_on(rows.index_select(0, r.token), r.counts)
        combined = torch.zeros_like(rows).index_add(0, r.token, out_rows * r.weight.to(out_rows.dtype).unsqueeze(1))
        self.stats = {"tokens": tokens, "capacity": cap, "dropped": r.dropped, "dropped_tokens": r.dropped_tokens,
                      "load": r.load.tolist()}
        return combined.reshape(x.shape), r.aux_loss

    def _experts_on(self, send: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows sorted by global expert (``counts`` per expert) -> the experts' outputs, in the same order."""
        runner = self._expert_runner if self._expert_runner is not None else self.experts
        g = self.groups
        if g.ep_group is None:
            return run_by_expert(send, counts.view(1, -1), runner)
        received = exchange_counts(counts, g.ep_size, g.ep_group)
        send_splits = counts.view(g.ep_size, self.num_local).sum(dim=1).tolist()
        recv_splits = received.sum(dim=1).tolist()
        rows = all_to_all(send, send_splits, recv_splits, g.ep_group)
        outs = run_by_expert(rows, received, runner)
        return all_to_all(outs, recv_splits, send_splits, g.ep_group)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_experts={self.num_experts}, ep_size={self.ep_size}, "
                f"k={self.k}, capacity_factor={self.capacity_factor}, drop_tokens={self.drop_tokens}")


def _check_args(hidden_size, expert, num_experts, k, capacity_factor, min_capacity) -> None:
    def positive_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v > 0

    if not positive_int(hidden_size):
        raise ValueError(f"hidden_size must be a positive integer, got {hidden_size!r}.")
    if not isinstance(expert, torch.nn.Module):
        raise ValueError(f"expert must be a torch.nn.Module, got {type(expert).__name__}.")
    if not positive_int(num_experts):
        raise ValueError(f"num_experts must be a positive integer, got {num_experts!r}.")
    if k not in (1, 2) or isinstance(k, bool):
        raise ValueError(f"k must be 1 (Switch) or 2 (GShard), got {k!r}.")
    if k > num_experts:
        raise ValueError(f"k={k} needs at least {k} experts, got num_experts={num_experts}.")
    if not isinstance(capacity_factor, (int, float)) or not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be a positive number, got {capacity_factor!r}.")
    if not isinstance(min_capacity, int) or isinstance(min_capacity, bool) or min_capacity < 0:
        raise ValueError(f"min_capacity must be a non-negative integer, got {min_capacity!r}.")


def _generator(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + index + 1) % (1 << 63))


@torch.no_grad()
def _seeded_init(module: torch.nn.Module, gen: torch.Generator) -> None:
    """Draw the floating parameters of every submodule holding a matrix uniform in ``±1/sqrt(fan_in)``."""
    for sub in module.modules():
        own = [p for p in sub.parameters(recurse=False) if p.is_floating_point()]
        matrices = [p for p in own if p.dim() >= 2]
        if not matrices:
            continue
        bound = 1.0 / max(1, matrices[0][0].numel()) ** 0.5
        for p in own:
            p.copy_(torch.rand(p.shape, generator=gen, dtype=torch.float64).mul_(2 * bound).sub_(bound))

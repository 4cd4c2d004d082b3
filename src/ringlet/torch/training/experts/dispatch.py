"""Moving tokens to their experts and back: a differentiable ragged all-to-all over ringlet's core
:func:`ringlet.alltoall`, and the arrangement of the received rows by local expert.

Wire contract (every member of the expert-parallel group of ``P`` ranks, ``L`` local experts each):

1. :func:`exchange_counts`: each rank sends, to each rank, how many of its rows go to each of that rank's
   ``L`` experts (an all-to-all of ``L`` int64 counts per destination); every rank learns the ``[P, L]``
   counts it will receive;
2. :func:`all_to_all`: the rows themselves, sorted by destination expert (hence by destination rank),
   ``send_splits[d]`` rows to rank ``d`` — exactly the kept rows, no padding to capacity. Its backward is
   the all-to-all of the output gradient with the splits swapped.

Both pass the core's ``recv_splits`` (step 1: ``L`` from everyone; step 2: what step 1 said), so the
core exchanges no counts of its own: one count exchange per dispatch, step 1. Under ``RINGLET_CHECK``
the core still checks every call's counts against the senders' in its one metadata round.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from ringlet import collectives as _core
from ringlet.group import Group

__all__ = ["all_to_all", "exchange_counts", "run_by_expert"]


def _exchange(x: torch.Tensor, send: Sequence[int], expect: Sequence[int], group: Group) -> torch.Tensor:
    return _core.alltoall(x.contiguous(), list(send), group, recv_splits=list(expect))[0]


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send, recv, group):  # noqa: D102 - see all_to_all
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _exchange(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102 - the gradient goes back the way the rows came
        return _exchange(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, send: Sequence[int], recv: Sequence[int], group: Group) -> torch.Tensor:
    """Send ``send[d]`` rows of ``x`` to member ``d`` of ``group``; return the rows received, in member
    order (``recv[s]`` from member ``s``, which the caller knows from :func:`exchange_counts`; counts
    that disagree with the senders' raise :class:`ringlet.types.MismatchError` on every member under
    ``RINGLET_CHECK``). Differentiable: the gradient travels back with the splits swapped."""
    return _AllToAll.apply(x, tuple(send), tuple(recv), group)


def exchange_counts(counts: torch.Tensor, ranks: int, group: Group) -> torch.Tensor:
    """``counts``: ``[ranks * L]`` int64 rows this rank sends to each global expert (member-major).
    Returns the ``[ranks, L]`` rows this rank receives for each of its ``L`` experts from each member."""
    local = counts.numel() // ranks
    out, _ = _core.alltoall(counts.to(torch.int64).contiguous(), [local] * ranks, group, recv_splits=[local] * ranks)
    return out.view(ranks, local)


def run_by_expert(rows: torch.Tensor, counts: torch.Tensor, run: Callable[[list[torch.Tensor]], list[torch.Tensor]]
                  ) -> torch.Tensor:
    """``rows`` arrive in blocks ``(source, local expert)`` of sizes ``counts[s, j]`` (source-major).
    ``run`` gets one tensor per local expert (its rows from every source, in source order; possibly
    empty) and returns their outputs; the outputs come back in the arrival order of ``rows``."""
    sources, local = counts.shape
    sizes = counts.reshape(-1).tolist()
    offsets = [0]
    for n in sizes:
        offsets.append(offsets[-1] + n)
    dev = rows.device
    order = torch.cat([torch.arange(offsets[s * local + j], offsets[s * local + j + 1], device=dev)
                       for j in range(local) for s in range(sources)])
    per_expert = counts.sum(dim=0).tolist()
    chunks = list(torch.split(rows.index_select(0, order), per_expert))
    outs = run(chunks)
    for j, (chunk, out) in enumerate(zip(chunks, outs)):
        if out.shape[:1] != chunk.shape[:1] or out.shape[1:] != rows.shape[1:]:
            raise ValueError(f"MoE: local expert {j} turned input {tuple(chunk.shape)} into output "
                             f"{tuple(out.shape)}; an expert must map [n, hidden_size] to [n, hidden_size].")
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=dev)
    return torch.cat(outs).index_select(0, inverse)

"""Sufficient factors: the average weight gradient of a fully connected layer, exchanged as the layer's
inputs and output gradients instead of the gradient itself.

For ``y = x Wᵀ + b`` over K rows (the batch, times any leading dimensions), ``dL/dW = δᵀ x`` with
``δ = dL/dy``: a matrix of rank at most K, given by ``K·(M+N)`` numbers instead of ``M·N``. The group's
average is ``(1/p) Σ_r δ_rᵀ x_r = (1/p) Δᵀ X``, with ``Δ`` and ``X`` the rows of every rank stacked: an
all-gather of the factors and one matrix product replace the all-reduce of the gradient. This is the
sufficient-factor broadcasting of Poseidon (Zhang et al., 2017) and is exact: the result differs from the
all-reduced gradient by rounding only. With 32 rows per rank and a 4096 → 512 layer on 4 ranks, each rank
sends 1.8 MB instead of the ring all-reduce's 12.6 MB, and computes a 512×128 by 128×4096 product.

Which layers: ``nn.Linear`` modules whose ``forward`` is nn.Linear's own and whose weight is a trainable
parameter registered once (no weight tying). Factors are captured by a forward hook (run before any other
forward hook, on the layer's own output) that keeps the input rows and hooks the output for δ; a pair is
complete only once its δ arrived, so forwards whose output never reaches a backward add nothing, and
recomputed forwards (activation checkpointing) add exactly what their backward accumulates.

Guard: every reduction, each rank checks that its own factors reproduce the gradient autograd accumulated
locally (along a random direction: one pass over the gradient). The weight used outside the layer's forward, a ``.grad`` holding values from before the
accumulation window, or ``zero_grad(set_to_none=False)`` between micro-batches all break that. Each
rank's verdict travels in a header row with its factors, so every rank sees every verdict; if any rank
failed, all of them all-reduce the dense gradient instead, which is torch DDP's result by definition.
"""
from __future__ import annotations

import collections
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ringlet.types import ReduceOp

__all__ = ["FactoredLinear", "eligible", "eligible_linears", "worth_factoring", "gather_factors", "average_from_factors",
           "average_from_factors_async"]

# A rank's factors must reproduce its gradient, along a random direction, to this fraction of the
# root-sum-square of the terms summed (the size of a random-sign sum of them): fp32 rounding differs by
# ~1e-6 of it, a missed or stale contribution of relative size r by about r of it.
_CHECK_RTOL = 1e-4


class FactoredLinear:
    """Factor capture for one ``nn.Linear``: ``rows`` seen by its last forward, completed ``pairs``
    ``(δ rows, input rows)`` since the last reduction. Pairs are captured only while ``enabled``, which
    the DDP sets from its forward until it launches the layer's reduction: forwards of the bare module
    outside that window add gradient but no pairs, which the guard then catches (dense reduction), and
    a module used without its DDP wrapper holds no activations."""

    __slots__ = ("name", "module", "weight", "out_features", "in_features", "rows", "pairs", "enabled", "out",
                 "generator", "capacity", "_handle")

    def __init__(self, name: str, module: torch.nn.Linear):
        self.name = name
        self.module = module
        self.weight = module.weight
        self.out_features, self.in_features = module.out_features, module.in_features
        self.rows = 0
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.enabled = False
        self.out: torch.Tensor | None = None  # the last average, reused when nothing else holds it
        # The guard's random directions: never from torch's default generator, whose stream (dropout,
        # shuffling) must stay what the training script seeded.
        self.generator = torch.Generator(device=self.weight.device).manual_seed(0x5F1C)
        # Rows per rank of the last gather, the same on every rank (read from the gathered headers): the
        # next gather sends that many rows, padded, without first exchanging sizes.
        self.capacity: int | None = None
        self._handle = module.register_forward_hook(self._forward_hook, prepend=True)

    def _forward_hook(self, module, args, out) -> None:
        if not args or not isinstance(out, torch.Tensor) or not out.requires_grad or not torch.is_grad_enabled():
            return
        x = args[0]
        self.rows = x.numel() // self.in_features if self.in_features else 0
        if not self.enabled:
            return
        if self.weight.grad is None:
            # Completed pairs went into a .grad that has since been set to None: they no longer count.
            self.pairs.clear()
        a = x.detach().reshape(-1, self.in_features)
        pairs, m = self.pairs, self.out_features

        def on_output_grad(g: torch.Tensor) -> None:
            pairs.append((g.detach().reshape(-1, m), a))

        out.register_hook(on_output_grad)

    def take_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The pairs of this accumulation window; the next window starts empty."""
        pairs, self.pairs = self.pairs, []
        return pairs

    def remove(self) -> None:
        self._handle.remove()


def eligible_linears(module: torch.nn.Module, params: set[int]) -> list[FactoredLinear]:
    """Capture objects for the layers of ``module`` whose weight gradient factors exactly (see the module doc);
    ``params``: ids of the parameters being reduced."""
    uses = collections.Counter(id(p) for _, p in module.named_parameters(remove_duplicate=False))
    return [FactoredLinear(name, m) for name, m in module.named_modules()
            if eligible(m) and id(m.weight) in params and uses[id(m.weight)] == 1]


def eligible(m: torch.nn.Module) -> bool:
    """Whether ``m`` itself qualifies: an ``nn.Linear`` with nn.Linear's own ``forward`` and a dense 2-D
    float32/float64 weight parameter (weight tying is the caller's to rule out)."""
    return (isinstance(m, torch.nn.Linear) and type(m).forward is torch.nn.Linear.forward
            and isinstance(m.weight, torch.nn.Parameter) and m.weight.layout == torch.strided
            and m.weight.dtype in (torch.float32, torch.float64) and m.weight.dim() == 2)


def worth_factoring(size: int, rows: int, out_features: int, in_features: int) -> bool:
    """Whether gathering factors may beat all-reducing the gradient: the gathered factors
    (``size·rows·(M+N)`` numbers) must be fewer than the gradient's (``M·N``), so each rank receives less than
    half of what a ring all-reduce moves (``2(p-1)/p·M·N``). The product it costs (``2·size·rows·M·N``
    flops) is not counted here: the DDP's step tuner times it against the dense reduction."""
    return size > 1 and rows > 0 and size * rows * (out_features + in_features) < out_features * in_features


def _matches(grad: torch.Tensor | None, d: torch.Tensor, a: torch.Tensor,
             generator: torch.Generator | None = None, rtol: float = _CHECK_RTOL) -> bool:
    """Whether ``grad`` is ``dᵀ a``, tested on a random direction (a pass over ``grad`` instead of the
    product and a comparison): each row of ``grad v`` against ``dᵀ(a v)``, to ``rtol`` of the row's
    root-sum-square of ``grad ∘ v``."""
    if grad is None:
        return d.shape[0] == 0
    if grad.shape != (d.shape[1], a.shape[1]):
        return False
    if d.shape[0] == 0:
        return not bool(grad.any())
    v = torch.randn(a.shape[1], dtype=grad.dtype, device=grad.device, generator=generator)
    want = torch.mv(d.t(), torch.mv(a, v))
    # In blocks of rows: a gradient-sized temporary would cost page faults on every step.
    step = max(1, (1 << 20) // max(1, grad.shape[1]))
    buf = torch.empty(min(step, grad.shape[0]), grad.shape[1], dtype=grad.dtype, device=grad.device)
    for i in range(0, grad.shape[0], step):
        terms = torch.mul(grad[i:i + step], v, out=buf[:min(step, grad.shape[0] - i)])
        diff = terms.sum(dim=1).sub_(want[i:i + step]).abs_()
        if not bool((diff <= rtol * torch.linalg.vector_norm(terms, dim=1)).all()):
            return False
    return True


def _tolerance(pairs: list) -> float:
    """The guard's tolerance for factors captured in ``pairs``' dtypes: under autocast (bf16 / fp16 δ
    and x) autograd's own product was rounded to that precision, so it is allowed a few of its ulps."""
    eps = max((torch.finfo(t.dtype).eps for pair in pairs for t in pair if t.is_floating_point()), default=0.0)
    return max(_CHECK_RTOL, 8 * eps) if eps > torch.finfo(torch.float32).eps else _CHECK_RTOL


@torch.no_grad()
def gather_factors(layer: FactoredLinear, grad: torch.Tensor | None, pairs: list, comm, name: str,
                   algorithm: str = "ring"):
    """Every rank's factors for ``layer``, or the dense average if some rank's factors do not match its
    gradient, through ``comm`` (a :class:`ringlet.torch.comm.Comm`; ops named ``name``). Runs where
    collectives may be issued (a job on ringlet's communication thread); ``grad``: this
    rank's local accumulated gradient (None if the weight got none). Returns ``("factors", rows, spans)``
    (``spans``: (start, count) of each rank's rows in ``rows``) or ``("dense", average)``. ``comm`` must
    schedule on the ordered core queue (:data:`~ringlet.torch.comm.ORDERED_QUEUE`): the collectives run
    inside the job, in its place.

    Once a gather has shown every rank's row count, the next one sends ``layer.capacity`` rows per rank
    (the largest count seen, padded) with no exchange of sizes first: one collective, no metadata round,
    where every rank must otherwise wait for the slowest twice. A rank with more rows than that says so
    in its header and every rank then gathers again by the actual sizes."""
    w = layer.weight
    m, n = layer.out_features, layer.in_features
    if pairs:
        d = torch.cat([p[0] for p in pairs]).to(w.dtype)
        a = torch.cat([p[1] for p in pairs]).to(w.dtype)
    else:
        d = torch.zeros(0, m, dtype=w.dtype, device=w.device)
        a = torch.zeros(0, n, dtype=w.dtype, device=w.device)
    k = d.shape[0]
    verdict = 1.0 if _matches(grad, d, a, layer.generator, _tolerance(pairs)) else 0.0

    def pack(rows_sent: int) -> torch.Tensor:
        out = torch.empty(1 + rows_sent, m + n, dtype=w.dtype, device=w.device)
        out[0].zero_()
        out[0, 0] = verdict
        out[0, 1] = float(k)  # exact up to 2^24 rows (fp32) / 2^53 (fp64), the only dtypes factored
        kept = min(k, rows_sent)
        out[1:1 + kept, :m] = d[:kept]
        out[1:1 + kept, m:] = a[:kept]
        if kept < rows_sent:
            out[1 + kept:].zero_()  # padding: never read, but no stale memory on the wire
        return out

    cap, size = layer.capacity, comm.size
    if cap is not None:
        rows = comm.allgather(pack(cap), name, sizes=[1 + cap] * size, check=False, algorithm=algorithm).wait()
        starts = [r * (1 + cap) for r in range(size)]
    if cap is None or max(int(rows[s, 1]) for s in starts) > cap:
        rows = comm.allgather(pack(k), name, algorithm=algorithm).wait()
        starts = [0]
        for _ in range(size - 1):
            starts.append(starts[-1] + 1 + int(rows[starts[-1], 1]))
    counts = [int(rows[s, 1]) for s in starts]
    layer.capacity = max(counts)
    spans = [(s + 1, c) for s, c in zip(starts, counts)]
    if not all(bool(rows[s, 0] == 1.0) for s in starts):
        dense = grad.clone() if grad is not None else torch.zeros_like(w)
        comm.allreduce_(dense, ReduceOp.AVG, f"{name}.dense").wait()
        return "dense", dense
    return "factors", rows, spans


@torch.no_grad()
def average_from_factors(gathered: tuple, out_features: int, size: int,
                         out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The group average ``(1/p) Δᵀ X`` from :func:`gather_factors`' rows (None when no rank had any),
    written into ``out`` when given (a fresh large tensor costs page faults on every step)."""
    _, rows, spans = gathered
    m = out_features
    body = torch.cat([rows[start:start + k] for start, k in spans if k]) if any(k for _, k in spans) else None
    if body is None:
        return None
    d, x = body[:, :m].mul_(1.0 / size).t(), body[:, m:]
    if out is not None and out.shape == (m, x.shape[1]) and out.dtype == x.dtype:
        return torch.mm(d, x, out=out)
    return torch.mm(d, x)


_worker: ThreadPoolExecutor | None = None
_worker_lock = threading.Lock()


def average_from_factors_async(gathered: tuple, out_features: int, size: int,
                               out: torch.Tensor | None = None) -> Future:
    """:func:`average_from_factors` on a worker thread of its own, started as soon as the gather is in.

    The communication thread hands the product over and goes on with the next collective, and the
    training thread finds the average done when backward ends: the product overlaps the rest of backward
    and the buckets still on the wire, instead of running after backward with the last bucket. One
    worker for the process keeps products in submission order and off each other's cores.
    """
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ringlet-factors")
        pool = _worker
    return pool.submit(average_from_factors, gathered, out_features, size, out)

"""``ringlet.torch.DistributedDataParallel``: torch's DDP contract, with ringlet moving the gradients.

Semantics (those of ``torch.nn.parallel.DistributedDataParallel`` on CPU):

* construction broadcasts parameters and buffers from the group's first rank;
* gradients are averaged over the group during ``backward()``: parameters are bucketed in reverse
  order of registration (about the order backward produces their gradients), each bucket a flat buffer
  of one dtype; when every gradient of a bucket has been accumulated its buffer goes to ringlet's
  communication thread at once (``allreduce_async_``, op AVG), so later layers' communication overlaps
  earlier layers' backward. Buckets start in index order on every rank, so ranks agree on the order.
  After the first reduced backward the parameters are bucketed again in the order their gradients
  arrived on the group's first rank (as torch's DDP rebuilds its buckets), so a module that registers
  layers in another order than it uses them still overlaps. A bucket's first reduction checks its shape
  and dtype across ranks; later ones skip that exchange;
* ``algorithm="auto"`` on 3-8 ranks (and ``tune=True``, no ``RINGLET_ALGORITHM``): the first steps try
  the static choice and ``direct`` in turn, five steps each (up to twenty while their medians are too
  close to call), and switch to ``direct`` only if its steps were more than 3% faster on all ranks
  together (:class:`ringlet.tuning.OnlineChoice`; :attr:`DistributedDataParallel.algorithm` tells);
* before ``backward()`` returns (an autograd-engine callback) every bucket is waited for and the
  averages land in ``param.grad``. A gradient that autograd created in this backward (``.grad`` was
  None at the forward, as after ``zero_grad()``) is replaced by a view of the average in the bucket, not
  copied into: one gradient-sized copy and buffer less per step, with nothing to observe but
  ``.grad`` being a view. A ``.grad`` that existed before the forward is updated in place, as torch
  does. Before a bucket is written again, it is replaced by a fresh one if anything besides the ``.grad``
  views it lent still holds its memory (a gradient kept across steps keeps its values); when
  ``.grad`` still is the lent view (``zero_grad(set_to_none=False)``, ``no_sync``), autograd accumulates
  straight into the bucket and nothing is copied in either;
* ``sufficient_factors="auto"`` (default): the weight of a plain ``nn.Linear`` whose gradient is
  smaller as factors than dense (rank 0's rows of the first step: ``p·rows·(in+out) < in·out``, e.g. a
  large fully connected layer on a small batch) is averaged from every rank's layer inputs and output
  gradients, gathered, instead of all-reduced (:mod:`ringlet.torch.training.factors`: exact up to rounding, checked
  on every rank every step, with a dense all-reduce on all ranks when any check fails). With the tuner
  on, those steps are timed against the dense reduction (five to twenty steps each, as above) and kept
  only if faster by more than 3% (:attr:`DistributedDataParallel.factored` tells); ``True`` factors
  every eligible layer untimed, ``False`` never. Under ``ringlet.torch``'s coordinator it is off;
* ``no_sync()``: forwards run inside it skip the reduction of their backward, so gradients accumulate
  locally; the first backward after it reduces the accumulated sum;
* ``find_unused_parameters=True``: the forward output's autograd graph is walked to find parameters
  that will get no gradient; they are marked ready with zero gradients at the first hook, and a usage map
  is reduced alongside so a parameter unused on every rank keeps ``grad`` untouched. Without the flag an
  unused parameter raises a ``RuntimeError`` naming it (after the buckets were still reduced, so the
  ranks stay in step) instead of hanging;
* ``broadcast_buffers=True``: buffers are broadcast from the first rank before every forward;
* ``gradient_as_bucket_view=True``: after a reduced backward each ``param.grad`` is a view into its
  bucket instead of a copy, which saves memory the size of the gradients and the copy back. A gradient
  that already is that view (``zero_grad(set_to_none=False)``, or accumulation under ``no_sync``) is
  accumulated into the bucket by autograd and not copied in either. As with torch, a gradient then
  aliases the bucket: a reference kept across steps sees the next step's values, and ``detach_()`` on
  it is not allowed.

Timeline (:mod:`ringlet.timeline`; ``RINGLET_TIMELINE`` is honoured from construction on):
``mark_step`` at the first forward of each step (micro-batches under ``no_sync`` belong to the step
they accumulate into), ``FORWARD`` spans, a ``BACKWARD`` span from the first to the last gradient hook,
``QUEUE`` (launch to start) and ``COMMUNICATE`` (the all-reduce) spans per bucket.

With ``ringlet.torch`` initialised, the collectives go through its name-matched coordinator instead of
ringlet's core queue (see :class:`Comm`); the coordinator then records the per-bucket phases.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from ringlet import collectives as _core
from ringlet import timeline
from ringlet.tuning import OnlineChoice
from ringlet.types import ReduceOp

from . import factors as _factors
from ..comm import Comm, CommFuture

log = logging.getLogger(__name__)

__all__ = ["DistributedDataParallel", "DDPOptions"]

_MB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class DDPOptions:
    """Bucketing and reduction choices, fixed at construction.

    ``first_bucket_cap_mb`` defaults to ``min(1, bucket_cap_mb)``: a small first bucket (the last layers)
    starts communication early in backward, as torch does.
    """

    bucket_cap_mb: float = 25.0
    first_bucket_cap_mb: float = 1.0
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    algorithm: str = "auto"
    tune: bool = True
    gradient_as_bucket_view: bool = False
    sufficient_factors: str = "auto"  # "off", "on" (every eligible layer) or "auto" (where it pays)


class _Bucket:
    """A flat buffer of gradients all-reduced together, or (``factor`` set) one fully connected layer's
    weight whose average is computed from gathered factors (:mod:`ringlet.torch.training.factors`)."""

    __slots__ = ("index", "params", "offsets", "buffer", "pending", "work", "t_launch", "validated", "algo", "lent",
                 "factor", "grad", "result")

    def __init__(self, index: int, params: list[torch.nn.Parameter], factor: _factors.FactoredLinear | None = None):
        self.index = index
        self.params = params
        self.offsets: list[int] = []
        n = 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.factor = factor
        self.grad: torch.Tensor | None = None  # factor entries: the local gradient of this backward
        self.result: tuple | None = None       # factor entries: (average or None, used factors)
        self.buffer = torch.zeros(0 if factor is not None else n, dtype=params[0].dtype, device=params[0].device)
        self.pending = len(params)
        self.work: CommFuture | None = None
        self.t_launch = 0.0
        # The first reduction with each algorithm checks the bucket's shape, dtype and algorithm across
        # ranks; the layout never changes afterwards, so later ones skip that exchange (torch DDP, too,
        # verifies shapes once, at construction).
        self.validated: set[str] = set()
        self.algo = ""
        self.lent = False  # some .grad is (or was) a view of buffer

    def slot(self, i: int) -> torch.Tensor:
        p = self.params[i]
        return self.buffer[self.offsets[i]:self.offsets[i] + p.numel()]


def assign_buckets(params: list[torch.nn.Parameter], cap_bytes: int, first_cap_bytes: int) -> list[list[int]]:
    """Indices of ``params`` per bucket: reverse registration order, one dtype/device per bucket, a bucket
    closed once it holds ``cap_bytes`` (``first_cap_bytes`` for the first bucket closed)."""
    closed: list[list[int]] = []
    open_: dict[tuple, list[int]] = {}
    size: dict[tuple, int] = {}
    for i in reversed(range(len(params))):
        p = params[i]
        key = (p.dtype, p.device)
        open_.setdefault(key, []).append(i)
        size[key] = size.get(key, 0) + p.numel() * p.element_size()
        if size[key] >= (first_cap_bytes if not closed else cap_bytes):
            closed.append(open_.pop(key))
            size[key] = 0
    closed.extend(b for b in open_.values() if b)
    # Launch order = order in which backward is expected to fill them (first member in reverse order).
    closed.sort(key=lambda b: -b[0])
    return closed


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


def _params_reached(output: Any) -> set[int]:
    """ids of the leaf tensors the autograd graph of ``output`` accumulates gradients into."""
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


class DistributedDataParallel(torch.nn.Module):
    """Wrap ``module`` so that ``backward()`` leaves the group-average of the gradients in ``param.grad``.

    ``process_group`` / ``group``: a :class:`ringlet.Group` or ``ringlet.torch`` ``ProcessSet``
    (default: the world). ``algorithm``: ringlet all-reduce algorithm for the buckets; ``tune``: with
    ``"auto"``, pick between candidates by timing the first training steps (see the module doc). ``device_ids``,
    ``output_device``, ``dim`` and ``static_graph`` are accepted for drop-in compatibility and have no
    effect here; ``gradient_as_bucket_view`` is honoured (see the module doc). ``sufficient_factors``:
    ``"auto"``, ``True`` or ``False``, whether large fully connected layers are averaged from gathered
    factors (see the module doc). ringlet must be initialised first.
    """

    _instances = 0  # wrappers created in this process: names their ops in coordinated mode

    def __init__(self, module: torch.nn.Module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool = True, process_group=None, bucket_cap_mb: float = 25.0,
                 find_unused_parameters: bool = False, gradient_as_bucket_view: bool = False,
                 static_graph: bool = False, *, group=None, first_bucket_cap_mb: float | None = None,
                 algorithm: str = "auto", tune: bool = True, sufficient_factors: bool | str = "auto"):
        super().__init__()
        if not _core_initialized():
            raise RuntimeError("ringlet is not initialised: call ringlet.init() (or ringlet.torch.init()) before "
                               "wrapping a module in DistributedDataParallel.")
        if bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
        first = min(1.0, bucket_cap_mb) if first_bucket_cap_mb is None else first_bucket_cap_mb
        factors = {True: "on", False: "off"}.get(sufficient_factors, sufficient_factors)
        if factors not in ("on", "off", "auto"):
            raise ValueError(f"sufficient_factors must be True, False or 'auto', got {sufficient_factors!r}")
        self.options = DDPOptions(float(bucket_cap_mb), float(first), bool(find_unused_parameters),
                                  bool(broadcast_buffers), algorithm, bool(tune), bool(gradient_as_bucket_view),
                                  factors)
        self.module = module
        # Scripts ported from torch DDP call ringlet.init() only, which does not read RINGLET_TIMELINE.
        timeline.configure_from_env(_core.runtime().rank)
        self._comm = Comm(group if group is not None else process_group, algorithm)
        self._size = self._comm.size
        DistributedDataParallel._instances += 1
        # Names for coordinated mode: identical on every rank as long as ranks wrap modules in the same order.
        self._prefix = f"ringlet.ddp{DistributedDataParallel._instances}"
        self.require_backward_grad_sync = True

        self._params = [p for p in module.parameters() if p.requires_grad]
        for p in self._params:
            if p.layout != torch.strided:
                raise ValueError("DistributedDataParallel supports dense parameters only.")
        self._names = {id(p): n for n, p in module.named_parameters()}
        self._pindex = {id(p): i for i, p in enumerate(self._params)}
        # Layers whose weight may be reduced from factors; which ones are is decided with the bucket rebuild.
        self._factor_layers: list[_factors.FactoredLinear] = []
        if factors != "off" and self._size > 1 and not self._comm.coordinated:
            self._factor_layers = _factors.eligible_linears(module, set(self._pindex))
        self._chosen: dict[int, _factors.FactoredLinear] = {}  # id(weight) -> layer worth factoring (rank 0's call)
        self._factors_on = False  # the active bucket set is the factored one
        # Bucket sets by "factors in use": the dense one always, the factored one once layers were chosen.
        self._sets: dict[bool, tuple[list[_Bucket], dict]] = {}
        self.factored_reductions = 0  # weight averages computed from factors (for tests and reports)
        self.factor_fallbacks = 0     # ... and all-reduced densely because a rank's factors did not match
        self._factor_gather = "ring"  # all-gather algorithm of the factors (for A/B measurements)
        self._buckets: list[_Bucket] = []
        self._where: dict[int, tuple[_Bucket, int, int]] = {}  # id(param) -> bucket, slot, flat index
        self._buckets, self._where = self._make_buckets(self._layout(self._params, {}), {})
        # Indices into _params in the order the first reduced backward delivered them (None once rebuilt).
        self._arrival: list[int] | None = []
        self._arrival_done = False

        self._lock = threading.Lock()
        self._armed = False          # the current forward's backward must reduce
        self._in_backward = False    # a hook of this backward fired; finalisation is queued
        self._ready: list[bool] = []      # per flat index: in the bucket buffer already
        self._got_grad: list[bool] = []   # per flat index: a real gradient (not zeros for an unused param)
        self._fresh: list[bool] = []      # per flat index: .grad was None when the forward ran
        self.fresh_buffers = 0            # buckets replaced because their memory was still held (for tests)
        self._lend_gradients = True       # False: copy averages into .grad (for A/B measurements)
        self._next_launch = 0
        self._unused: list[torch.nn.Parameter] = []
        self._usage: torch.Tensor | None = None
        self._usage_work = None
        self._step_open = False
        self._t_first = self._t_last = 0.0
        # Five to twenty steps per candidate and a 3% margin for the challenger: step times on a shared host
        # vary by more than the candidates differ, and a decision made on noise flips from run to run.
        self._tuner = OnlineChoice(self._candidates(), trials=5, margin=0.03, max_trials=20)
        self._t_step: float | None = None  # perf_counter at the start of the current step
        self._step_reduced = False

        self._broadcast_state()
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self._params]

    # ---- public -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forwards inside the block skip gradient reduction in their backward (local accumulation)."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def forward(self, *inputs, **kwargs):
        grad = torch.is_grad_enabled()
        if grad and not self._step_open:
            timeline.mark_step()
            self._step_open = True
            self._step_started()
            if self._arrival_done and self._arrival is not None:
                self._rebuild_buckets()
            self._activate(self._factors_wanted())
        if self._factors_on:
            for f in self._chosen.values():
                f.enabled = True  # capture from the DDP's forwards until the layer's reduction is launched
        if self.options.broadcast_buffers and self._size > 1:
            self._broadcast(list(self.module.buffers()), "buffers")
        tl = timeline.active()
        t0 = timeline.now_us() if tl is not None else 0.0
        out = self.module(*inputs, **kwargs)
        if tl is not None:
            tl.span("forward", "FORWARD", t0, timeline.now_us())
        if grad:
            self._prepare(out if self.require_backward_grad_sync else None)
        return out

    @property
    def algorithm(self) -> str:
        """The all-reduce algorithm the buckets use now (during tuning: the one on trial); ``auto``
        under ``RINGLET_ALGORITHM`` reports the algorithm that variable forces."""
        return _core.resolve_algorithm(self._tuner.current().split("+")[0], _core.runtime())

    @property
    def bucket_layout(self) -> list[list[str]]:
        """Parameter names per bucket, in launch order (for inspection and tests)."""
        return [[self._names.get(id(p), "?") for p in b.params] for b in self._buckets]

    @property
    def factored(self) -> list[str]:
        """Names of the weights whose average is computed from gathered factors (empty until the second
        step: the first one reduces everything densely and measures the layers' row counts)."""
        return [self._names.get(id(b.params[0]), "?") for b in self._buckets if b.factor is not None]

    # ---- buckets ---------------------------------------------------------------------------------------
    def _layout(self, params: list[torch.nn.Parameter], factored: dict) -> list[list[torch.nn.Parameter]]:
        """Buckets of ``params`` filled from the end of the list (the end is expected first in backward);
        the weights in ``factored`` get an entry each."""
        dense = [p for p in params if id(p) not in factored]
        layout = assign_buckets(dense, int(self.options.bucket_cap_mb * _MB),
                                int(self.options.first_bucket_cap_mb * _MB))
        entries = [[dense[i] for i in idx] for idx in layout]
        if factored:
            # One entry per factored weight, launched in the order the entries become ready: an entry is
            # ready when its member nearest the front of ``params`` (the last expected in backward) is.
            pos = {id(p): i for i, p in enumerate(params)}
            entries += [[p] for p in params if id(p) in factored]
            entries.sort(key=lambda ps: min(pos[id(p)] for p in ps), reverse=True)
        return entries

    @staticmethod
    def _make_buckets(layout: list[list[torch.nn.Parameter]], factored: dict) -> tuple[list[_Bucket], dict]:
        buckets = [_Bucket(k, ps, factored.get(id(ps[0])) if len(ps) == 1 else None) for k, ps in enumerate(layout)]
        where: dict[int, tuple[_Bucket, int, int]] = {}
        for b in buckets:
            for j, p in enumerate(b.params):
                where[id(p)] = (b, j, len(where))
        return buckets, where

    def _factors_wanted(self) -> bool:
        """Whether the step starting now reduces the chosen layers from factors: the candidate on trial
        while the tuner compares with and without them, afterwards its choice; without a comparison
        (``sufficient_factors=True``, or ``tune=False``) whenever layers were chosen."""
        if not self._chosen:
            return False
        if any(c.endswith("+factors") for c in self._tuner.candidates):
            return self._tuner.current().endswith("+factors")
        return True

    def _activate(self, factors: bool) -> None:
        """Switch between the dense and the factored bucket sets (only between steps)."""
        factors = factors and True in self._sets
        if not self._sets or factors == self._factors_on:
            return
        self._buckets, self._where = self._sets[factors]
        self._factors_on = factors
        for f in self._factor_layers:
            f.enabled = False
            f.pairs.clear()

    def _rebuild_buckets(self) -> None:
        """Once, at the forward after the first reduced backward: bucket in gradient-arrival order.

        Rank 0's order is broadcast so every rank builds the same buckets (they must launch the same
        buffers in the same order). Parameters that got no gradient go last, in reverse registration order.
        """
        arrival, self._arrival = list(dict.fromkeys(self._arrival or [])), None
        seen = set(arrival)
        # Rank 0 also decides which layers reduce from factors (by its row counts): one decision for all.
        mode = self.options.sufficient_factors
        wanted = [int(mode == "on" or _factors.worth_factoring(self._size, f.rows, f.out_features, f.in_features))
                  for f in self._factor_layers]
        n = len(self._params)
        order = torch.tensor(arrival + [i for i in reversed(range(n)) if i not in seen] + wanted, dtype=torch.int64)
        if self._size > 1:
            self._comm.broadcast_(order, f"{self._prefix}.order").wait()
        values = order.tolist()
        self._chosen = {id(f.weight): f for f, w in zip(self._factor_layers, values[n:]) if w}
        if self._chosen:
            log.info("DistributedDataParallel: weight gradients that may be reduced from factors: %s",
                     ", ".join(f.name for f in self._chosen.values()))
        # _layout fills from the end of its list, so hand it the arrival order reversed.
        ordered = [self._params[i] for i in reversed(values[:n])]
        layout = self._layout(ordered, {})
        dense = (self._buckets, self._where)
        if [[id(p) for p in ps] for ps in layout] != [[id(p) for p in b.params] for b in self._buckets]:
            log.info("DistributedDataParallel: buckets rebuilt in gradient-arrival order (%d buckets)", len(layout))
            dense = self._make_buckets(layout, {})
        self._sets = {False: dense}
        if self._chosen:
            self._sets[True] = self._make_buckets(self._layout(ordered, self._chosen), self._chosen)
        self._buckets, self._where = dense
        for f in self._factor_layers:
            if id(f.weight) not in self._chosen:
                f.remove()  # no row counts needed any more
        self._factor_layers = list(self._chosen.values())
        if not self._chosen:
            for c in self._tuner.candidates:
                if c.endswith("+factors"):
                    self._tuner.remove(c)

    # ---- construction-time and per-forward broadcasts ------------------------------------------------
    def _broadcast_state(self) -> None:
        if self._size > 1:
            self._broadcast([p.data for p in self.module.parameters()] + list(self.module.buffers()), "state")

    @torch.no_grad()
    def _broadcast(self, tensors: list[torch.Tensor], what: str) -> None:
        by_kind: dict[tuple, list[torch.Tensor]] = {}
        for t in tensors:
            if t.numel():
                by_kind.setdefault((t.dtype, t.device), []).append(t)
        works = []
        for i, ts in enumerate(by_kind.values()):  # one coalesced broadcast per dtype, same order everywhere
            flat = torch.cat([t.reshape(-1) for t in ts])
            works.append((ts, flat, self._comm.broadcast_(flat, f"{self._prefix}.{what}{i}")))
        for ts, flat, w in works:
            w.wait()
            off = 0
            for t in ts:
                t.copy_(flat[off:off + t.numel()].view_as(t))
                off += t.numel()

    # ---- reduction state machine ------------------------------------------------------------------------
    def _prepare(self, out) -> None:
        """Arm the hooks for the backward of this forward (``out`` is None under ``no_sync``)."""
        with self._lock:
            if self._in_backward:
                raise RuntimeError("DistributedDataParallel: a forward ran while the previous backward's "
                                   "reduction was unfinished.")
            self._armed = out is not None
            if not self._armed:
                return
            if self._arrival is not None and not self._arrival_done:
                self._arrival = []  # an earlier backward that failed half-way must not count
            self._ready = [False] * len(self._params)
            self._got_grad = [False] * len(self._params)
            self._fresh = [p.grad is None for p in self._flat_params()]
            if not self.options.gradient_as_bucket_view and self._lend_gradients:
                self._reclaim_buckets()
            for b in self._buckets:
                b.pending, b.work = len(b.params), None
                b.grad = b.result = None
            self._next_launch = 0
            if self.options.find_unused_parameters:
                reached = _params_reached(out)
                self._unused = [p for p in self._params if id(p) not in reached]

    def _reclaim_buckets(self) -> None:
        """Give a bucket a fresh buffer when memory it lent as ``.grad`` is held by anything else."""
        for b in self._buckets:
            if not b.lent or b.factor is not None:
                continue
            attached = sum(1 for j, p in enumerate(b.params) if p.grad is not None and _is_view_of(p.grad, b.slot(j)))
            refs = _tensors_sharing(b.buffer)
            if refs is None or refs > 1 + attached:
                b.buffer = torch.empty_like(b.buffer)  # every slot is written before the launch
                b.lent = False
                self.fresh_buffers += 1

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        if not self._armed:
            return
        with self._lock:
            if not self._in_backward:
                self._in_backward = True
                self._t_first = timeline.now_us()
                torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
                for q in self._unused:
                    self._mark_ready(q, None)
            if self._arrival is not None and not self._arrival_done:
                self._arrival.append(self._pindex[id(p)])
            self._mark_ready(p, p.grad)
            self._t_last = timeline.now_us()

    def _mark_ready(self, p: torch.nn.Parameter, grad: torch.Tensor | None) -> None:
        b, j, k = self._where[id(p)]
        if self._ready[k]:
            raise RuntimeError(f"DistributedDataParallel: parameter {self._names.get(id(p), '?')} received a "
                               "gradient twice in one backward (reentrant backward or a parameter used in two "
                               "separate backward passes of one forward is not supported).")
        self._ready[k] = True
        self._got_grad[k] = grad is not None
        if b.factor is not None:
            b.grad = grad  # the local gradient, checked against the factors on the comm thread
            b.pending -= 1
            self._launch_ready()
            return
        slot = b.slot(j)
        if grad is None:
            if p.grad is not None and _is_view_of(p.grad, slot):
                p.grad = p.grad.clone()  # an unused parameter keeps its gradient, apart from the bucket
            slot.zero_()
        else:
            if grad.is_sparse:
                raise ValueError("DistributedDataParallel does not reduce sparse gradients.")
            if not _is_view_of(grad, slot):  # autograd accumulated straight into the bucket otherwise
                slot.copy_(grad.reshape(-1))
        b.pending -= 1
        self._launch_ready()

    # ---- choosing the algorithm while training runs ---------------------------------------------------
    def _candidates(self) -> tuple[str, ...]:
        algo = self.options.algorithm
        # The coordinator (ringlet.torch initialised) picks algorithms itself; an explicit algorithm or
        # RINGLET_ALGORITHM is the user's choice; direct sends p(p-1) messages per step, so small groups only.
        if (not self.options.tune or algo != "auto" or self._comm.coordinated
                or _core.resolve_algorithm(algo, _core.runtime()) != "auto" or not 3 <= self._size <= 8):
            base: tuple[str, ...] = (algo,)
        else:
            base = ("auto", "direct")
        # "auto" factors are timed against the dense reduction (only worth it where the network is slow).
        if (self.options.sufficient_factors == "auto" and self._factor_layers and self.options.tune
                and not self._comm.coordinated):
            base += (base[0] + "+factors",)
        return base

    def _step_started(self) -> None:
        """At the first forward of a step: time the previous one (if it reduced) and decide when due."""
        now = time.perf_counter()
        if self._t_step is not None and self._step_reduced:
            self._tuner.record(now - self._t_step)
            if self._tuner.ready:
                self._decide()
        self._t_step = now
        self._step_reduced = False

    def _decide(self) -> None:
        # Summed over ranks so that every rank picks from the same numbers (a rank choosing differently
        # would run a different schedule than its peers).
        times = torch.tensor(self._tuner.stats(), dtype=torch.float64)
        self._comm.allreduce_(times, ReduceOp.SUM, f"{self._prefix}.tune").wait()
        decision = self._tuner.decide(times.tolist())
        if decision is None:  # too close to call yet: more trials of every candidate
            return
        per_rank = {k: round(v / self._size * 1000, 2) for k, v in decision.times.items()}
        log.info("DistributedDataParallel: all-reduce algorithm %r (median step ms per candidate: %s)",
                 decision.choice, per_rank)
        timeline.instant("tuning", "choose_algorithm", {"choice": decision.choice, "step_ms": per_rank})
        # The set not chosen is dropped (its buffers, and the factor capture when dense won). With
        # sufficient_factors=True the factors were not on trial: the tuner only picked the algorithm.
        on_trial = any(c.endswith("+factors") for c in decision.times)
        if True in self._sets and on_trial and not decision.choice.endswith("+factors"):
            for f in self._factor_layers:
                f.remove()
            self._chosen, self._factor_layers = {}, []
            del self._sets[True]
        elif True in self._sets:
            del self._sets[False]

    def _launch_ready(self) -> None:
        while self._next_launch < len(self._buckets) and self._buckets[self._next_launch].pending == 0:
            self._launch(self._buckets[self._next_launch])
            self._next_launch += 1

    def _launch(self, b: _Bucket) -> None:
        timed = timeline.active() is not None
        b.t_launch = timeline.now_us() if timed else 0.0
        b.algo = self._tuner.current().split("+")[0]
        if b.factor is not None:
            layer, grad, pairs = b.factor, b.grad, b.factor.take_pairs()
            layer.enabled = False  # every pair of this window is in: backward reached the weight
            group, size, algo = self._comm.group, self._size, self._factor_gather
            out = self._reusable_out(b)  # decided here: backward is done with this weight

            def job():
                res = _factors.gather_factors(layer, grad, pairs, group, size, algo)
                if res[0] != "factors":
                    return res
                return "average", _factors.average_from_factors_async(res, layer.out_features, size, out)

            b.work = self._comm.submit(job, timed=timed)
            self._step_reduced = True
            return
        b.work = self._comm.allreduce_(b.buffer, ReduceOp.AVG, f"{self._prefix}.bucket{b.index}", timed=timed,
                                       check=None if b.algo not in b.validated else False, algorithm=b.algo)
        self._step_reduced = True

    def _finalize(self) -> None:
        """End of backward: launch what is left, wait for every bucket, write the averages into ``.grad``."""
        with self._lock:
            missing = [p for k, p in enumerate(self._flat_params()) if not self._ready[k]]
            for p in missing:  # zeros keep the ranks in step even when this rank is about to raise
                self._mark_ready(p, None)
            self._launch_ready()
            if self.options.find_unused_parameters:
                # How many ranks produced a real gradient per parameter: an all-zero entry keeps .grad as is.
                self._usage = torch.tensor(self._got_grad, dtype=torch.int32)
                self._usage_work = self._comm.allreduce_(self._usage, ReduceOp.SUM, f"{self._prefix}.usage")
            t_first, t_last = self._t_first, self._t_last
            self._in_backward = False
            self._armed = False
        tl = timeline.active()
        if tl is not None:
            tl.span("backward", "BACKWARD", t_first, t_last)
        error: BaseException | None = None
        for b in self._buckets:
            try:
                result = b.work.wait()
                if b.factor is not None:
                    # The product ran on the factor worker while backward went on: its future is done or
                    # nearly so by now.
                    b.result = (result[1].result(), True) if result[0] == "average" else (result[1], False)
                b.validated.add(b.algo)
            except BaseException as exc:  # noqa: BLE001 - keep waiting so no bucket is left in flight
                error = error or exc
        if self._usage_work is not None:
            try:
                self._usage_work.wait()
            except BaseException as exc:  # noqa: BLE001
                error = error or exc
            self._usage_work = None
        if error is not None:
            raise error
        if tl is not None:
            self._record_comm(tl)
        self._step_open = False
        self._arrival_done = True
        if missing and not self.options.find_unused_parameters:
            names = ", ".join(self._names.get(id(p), "?") for p in missing[:10])
            raise RuntimeError(f"DistributedDataParallel: {len(missing)} parameter(s) received no gradient in "
                               f"this backward ({names}). Pass find_unused_parameters=True if parts of the "
                               "model are unused in some iterations, or make every parameter take part in "
                               "producing the loss.")
        self._copy_back()

    def _flat_params(self) -> list[torch.nn.Parameter]:
        return [p for b in self._buckets for p in b.params]

    @torch.no_grad()
    def _copy_back(self) -> None:
        usage = self._usage.tolist() if self.options.find_unused_parameters else None
        as_view = self.options.gradient_as_bucket_view
        for b in self._buckets:
            if b.factor is not None:
                self._factor_result(b)
                continue
            for j, p in enumerate(b.params):
                k = self._where[id(p)][2]
                avg = b.slot(j).view_as(p)
                if not self._got_grad[k] and (usage is None or usage[k] == 0):
                    continue  # no rank used it: leave .grad as it was, like torch
                if p.grad is not None and _is_view_of(p.grad, avg):
                    continue  # autograd accumulated into the bucket: the average is in place
                if as_view or (self._lend_gradients and self._fresh[k] and p.is_contiguous()):
                    p.grad = avg
                    b.lent = True
                elif p.grad is None:
                    p.grad = avg.clone()
                else:
                    p.grad.copy_(avg)

    def _reusable_out(self, b: _Bucket) -> torch.Tensor | None:
        """The layer's last average if nothing holds it any more but, possibly, the weight's ``.grad``
        view (about to be overwritten with the new average anyway)."""
        out = b.factor.out
        if out is None:
            return None
        g = b.params[0].grad
        refs = _tensors_sharing(out)
        attached = 1 if g is not None and _is_view_of(g, out) else 0
        return out if refs is not None and refs <= 1 + attached else None

    def _factor_result(self, b: _Bucket) -> None:
        avg, used = b.result
        b.grad = b.result = None
        if used:
            self.factored_reductions += 1
        else:
            self.factor_fallbacks += 1
        if avg is None:
            return  # no rank had a gradient for it: leave .grad as it was, like torch
        p = b.params[0]
        if used:
            b.factor.out = avg
        if self._fresh[self._where[id(p)][2]] or p.grad is None:
            p.grad = avg.view_as(p)
        elif p.grad.data_ptr() != avg.data_ptr():
            p.grad.copy_(avg.view_as(p))

    def _record_comm(self, tl: timeline.Timeline) -> None:
        for b in self._buckets:
            times = b.work.span()
            if times is None:
                continue
            start, end = times
            track = f"ddp.bucket{b.index}"
            tl.span(track, "QUEUE", b.t_launch, start)
            tl.span(track, "COMMUNICATE", start, end,
                    {"bytes": b.buffer.numel() * b.buffer.element_size(), "params": len(b.params)})


def _is_view_of(grad: torch.Tensor, slot: torch.Tensor) -> bool:
    """Whether ``grad`` is exactly the (contiguous) memory of ``slot``."""
    return (grad.data_ptr() == slot.data_ptr() and grad.numel() == slot.numel() and grad.is_contiguous()
            and grad.dtype == slot.dtype and grad.device == slot.device)


def _tensors_sharing(t: torch.Tensor) -> int | None:
    """How many tensors (``t`` included) hold ``t``'s memory; None when this torch build cannot tell."""
    try:
        # The storage object made for the question holds one reference itself.
        return torch._C._storage_Use_Count(t.untyped_storage()._cdata) - 1
    except (AttributeError, RuntimeError, TypeError):
        return None


def _core_initialized() -> bool:
    try:
        _core.runtime()
    except Exception:  # noqa: BLE001 - whatever "not initialised" raises
        return False
    return True

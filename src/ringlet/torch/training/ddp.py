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
* ``algorithm="auto"`` (and ``tune=True``, no ``RINGLET_ALGORITHM``): the first steps try ``"auto"``
  against, with a cost model installed, the model's two best other algorithms for the buckets, else on
  3-8 ranks ``direct``, in turn, five steps each (up to twenty while their medians are too close to
  call), and keep a challenger only if its steps were more than 3% faster on all ranks together
  (:class:`ringlet.tuning.TrialPlan`, :class:`ringlet.tuning.OnlineChoice`;
  :attr:`DistributedDataParallel.algorithm` tells);
* ``adapt=Adapt(...)`` (default; None: off), with a cost model installed and ``"auto"``: after the step
  tuner's decision, every ``every`` steps the measured all-reduce times correct the model's constants
  (summed over ranks, so every rank decides the same at the same step); the model switches algorithm or
  segment size per message, or the bucket cap (the buckets are rebuilt), each switch logged and marked on
  the timeline (:mod:`~ringlet.torch.training.adapt`; :attr:`DistributedDataParallel.switches` tells);
  when the measured times move far from the model's, the step tuner's trial runs again;
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
  the same layers untimed (never one whose factors are not fewer numbers than its gradient: it would
  only add a collective), ``False`` none;
* ``compression`` (a name for :func:`ringlet.compression.get` such as ``"fp16"``, or a
  :class:`ringlet.compression.Compressor`): the dense buckets are averaged by a compressed all-reduce
  (:class:`~ringlet.torch.training.compressed_reduction.CompressedReduction`: float32 accumulation, the
  compressor's state per bucket); weights averaged from sufficient factors are not compressed again.
  The step tuner's candidates all keep the compression (``direct`` then picks the direct all-gather of
  the payloads). Compressed buckets run on ringlet's core queue like the others;
* ``priority=ringlet.torch.Priority(partition_bytes=...)``: instead of first-in-first-out bucket launches,
  dense buckets are cut into pieces and each free moment of the communication thread sends the
  front-most piece ready on every rank, the order agreed in band (``piece_round.py`` says why it cannot
  mismatch or deadlock); compressed and factored buckets are whole pieces. With
  :meth:`DistributedDataParallel.overlap_optimizer` the averages overlap the next forward: ``backward()``
  returns at once, each module's forward waits for its own parameters' averages and updates, and the
  buffers of the next forward are broadcast as backward begins;
* ``no_sync()``: forwards run inside it skip the reduction of their backward, so gradients accumulate
  locally; the first backward after it reduces the accumulated sum;
* ``find_unused_parameters=True``: the forward output's autograd graph is walked to find parameters
  that will get no gradient; they are marked ready with zero gradients at the first hook, and a usage map
  is reduced alongside so a parameter unused on every rank keeps ``grad`` untouched. Without the flag an
  unused parameter raises a ``RuntimeError`` naming it (after the buckets were still reduced, so the
  ranks stay in step) instead of hanging;
* parameters and buffers named in ``module._ddp_params_and_buffers_to_ignore`` (torch DDP's attribute) are
  neither broadcast nor averaged: another reducer owns them (:func:`ringlet.torch.moe_parallel` puts the
  experts of a mixture-of-experts layer there and averages them over their own group);
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
``QUEUE`` (launch to start) and ``COMMUNICATE`` (the all-reduce) spans per bucket (per piece with
``priority=``, whose agreements are ``NEGOTIATE`` spans on ``ddp.priority``; the forward's ``WAIT`` and
``UPDATE`` spans show :meth:`~DistributedDataParallel.overlap_optimizer` landing averages and updates).

The collectives run on ringlet's core queue in bucket order (:data:`~ringlet.torch.comm.ORDERED_QUEUE`),
whether or not ``ringlet.torch`` (``hvd.init()``) is initialised in the process: every option behaves the
same either way.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from typing import Iterator

import torch

from ringlet import collectives as _core
from ringlet import steps as step_clock, straggler, timeline
from ringlet.tuning import StepTuner, TrialPlan
from ringlet.tuning.adaptive import Switch
from ringlet.types import ReduceOp

from ..comm import Comm
from .adapt import Adapt, adjuster_for, group_hosts
from .broadcast import Coalesced, broadcast_coalesced, start_coalesced
from .bucket_plan import BucketPlan
from .buckets import ArrivalOrder, BucketSets
from .factor_reduction import FactorLayers
from .graph import params_reached
from .launch_fifo import FifoLaunch
from .launch_priority import PriorityLaunch
from .options import DDPOptions
from .overlap import OptimizerOverlap
from .readouts import ReadOuts
from .reducer import BucketReducer
from .reduction import DenseReduction, ReductionContext

log = logging.getLogger(__name__)

__all__ = ["DistributedDataParallel", "DDPOptions"]


class DistributedDataParallel(ReadOuts, torch.nn.Module):
    """Wrap ``module`` so that ``backward()`` leaves the group-average of the gradients in ``param.grad``.

    ``process_group`` / ``group``: a :class:`ringlet.Group` or ``ringlet.torch`` ``ProcessSet``
    (default: the world). ``algorithm``: ringlet all-reduce algorithm for the buckets; ``tune``: with
    ``"auto"``, pick between candidates by timing the first training steps (see the module doc). ``device_ids``,
    ``output_device``, ``dim`` and ``static_graph`` are accepted for drop-in compatibility and have no
    effect here; ``gradient_as_bucket_view`` is honoured (see the module doc). ``sufficient_factors``:
    ``"auto"``, ``True`` or ``False``, whether large fully connected layers are averaged from gathered
    factors (see the module doc). ``compression``: how the dense buckets travel; ``priority``: a
    :class:`~ringlet.torch.training.priority.Priority` to send front layers first; ``adapt``: an
    :class:`~ringlet.torch.training.adapt.Adapt` for dynamic adjustment, or None (see the module doc).
    ringlet must be initialised first.
    """

    _instances = 0  # wrappers created in this process: names their ops
    # False for a wrapper run inside another's forward (the experts of an MoE layer): the outer one marks
    # the steps and the FORWARD/BACKWARD spans on the timeline; this one only its communication.
    _traces_steps = True

    def __init__(self, module: torch.nn.Module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool = True, process_group=None, bucket_cap_mb: float = 25.0,
                 find_unused_parameters: bool = False, gradient_as_bucket_view: bool = False,
                 static_graph: bool = False, *, group=None, first_bucket_cap_mb: float | None = None,
                 algorithm: str = "auto", tune: bool = True, sufficient_factors: bool | str = "auto",
                 compression=None, priority=None, adapt: Adapt | None = Adapt()):
        super().__init__()
        if not _core_initialized():
            raise RuntimeError("ringlet is not initialised: call ringlet.init() (or ringlet.torch.init()) before "
                               "wrapping a module in DistributedDataParallel.")
        self.options = DDPOptions.parse(bucket_cap_mb, first_bucket_cap_mb, sufficient_factors, compression, priority,
                                        find_unused_parameters=find_unused_parameters,
                                        broadcast_buffers=broadcast_buffers, algorithm=algorithm, tune=tune,
                                        gradient_as_bucket_view=gradient_as_bucket_view, adapt=adapt)
        self.module = module
        # Scripts ported from torch DDP call ringlet.init() only, which does not read RINGLET_TIMELINE.
        timeline.configure_from_env(_core.runtime().rank)
        self._comm = Comm(group if group is not None else process_group, algorithm)
        self._meter = straggler.meter()  # this rank's step times, for straggler detection
        self._size = self._comm.size
        DistributedDataParallel._instances += 1
        # Op names (checked across ranks): identical on every rank as long as ranks wrap modules in the same order.
        self._prefix = f"ringlet.ddp{DistributedDataParallel._instances}"
        self.require_backward_grad_sync = True
        self._params = _trainable(module, _ignored(module))
        self._names = {id(p): n for n, p in module.named_parameters()}
        self._pindex = {id(p): i for i, p in enumerate(self._params)}
        self._ctx = ReductionContext(self._comm, self._prefix, self.options.gradient_as_bucket_view)
        self._dense = DenseReduction(self._ctx)
        # Layers whose weight may be reduced from factors; which ones are is decided with the bucket rebuild.
        self._factors = FactorLayers(module, set(self._pindex), self.options.sufficient_factors,
                                     self._size > 1)
        algo = lambda: self._bucket_algorithm()  # noqa: E731 - read at each launch
        self._launch = FifoLaunch(algo) if priority is None else PriorityLaunch(priority, self._ctx, algo)
        self._reducer = BucketReducer(self._launch, lambda p: self._names.get(id(p), "?"), "DistributedDataParallel")
        self._plan = BucketPlan(self._params, self.options, self._ctx, self._dense, self._launch.spacing)
        self._sets = BucketSets(self._plan.initial())
        itemsize = self._params[0].element_size() if self._params else 4
        self._adjust = adjuster_for(adapt, self._comm, algorithm, self.options.compression, itemsize,
                                    self._sum_across_ranks)
        self._ctx.observe = self._adjust.observe if self._adjust is not None else None
        self._arrivals = ArrivalOrder()
        self._overlap: OptimizerOverlap | None = None
        self._early_buffers: Coalesced | None = None  # the next forward's buffer broadcast, in flight
        self._init_step_state()
        self._steps = StepTuner(self._trial_plan().candidates(), self._sum_across_ranks)
        self._retrial_from: str | None = None  # what the buckets ran before a re-trial, until it decides
        if self._size > 1:
            broadcast_coalesced(self._comm, [p.data for p in _kept(module.named_parameters(), _ignored(module))]
                                + self._synced_buffers(),
                                f"{self._prefix}.state")
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self._params]

    def _init_step_state(self) -> None:
        self._lock = threading.Lock()
        self._armed = False          # the current forward's backward must reduce
        self._in_backward = False    # a hook of this backward fired; finalisation is queued
        self._unused: list[torch.nn.Parameter] = []
        self._usage: torch.Tensor | None = None
        self._usage_work = None
        self._step_open = False
        self._t_first = self._t_last = 0.0

    def _trial_plan(self) -> TrialPlan:
        # With a cost model, "auto" is tried against the model's best other algorithms for the buckets
        # (TrialPlan.candidates).
        model = _core.runtime().selector.model
        sizes = tuple(sorted(set(self._launch.messages(self._sets.active).values()))) if model is not None else ()
        return TrialPlan(self.options.algorithm, self._size, self.options.tune,
                         self._factors.on_trial, lambda a: _core.resolve_algorithm(a, _core.runtime()),
                         model=model, buckets=sizes, host_of=group_hosts(self._comm) if model is not None else (),
                         itemsize=self._params[0].element_size() if self._params else 4, native=self._native_fits())

    def _native_fits(self) -> bool:
        """Whether the backend's own all-reduce takes every dense bucket (uncompressed, its dtypes)."""
        caps = _core.runtime().transport.capabilities
        return self.options.compression is None and caps.native_takes(self._params)

    def _bucket_algorithm(self) -> str:
        """The algorithm the buckets request now: the step tuner's, until dynamic adjustment took over."""
        adj = self._adjust
        return "auto" if adj is not None and adj.released else self._steps.algorithm

    def _synced_buffers(self) -> list[torch.Tensor]:
        """The module's buffers that are broadcast (those not in ``_ddp_params_and_buffers_to_ignore``)."""
        return _kept(self.module.named_buffers(), _ignored(self.module))

    def _sum_across_ranks(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        self._comm.allreduce_(t, ReduceOp.SUM, f"{self._prefix}.tune").wait()
        return t.tolist()

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

    def prepare_for_backward(self, output) -> None:
        """Make the next backward through the module reduce, as the backward of a forward run outside
        :meth:`no_sync` does: for callers that run several forwards under ``no_sync()`` and their backwards in
        another order (pipeline schedules), called just before the one backward that reduces the sum all of
        them accumulated. ``output``: that backward's root (``find_unused_parameters`` walks its graph).
        ``RuntimeError`` while a backward's reduction is unfinished."""
        self._prepare(output)

    def forward(self, *inputs, **kwargs):
        grad = torch.is_grad_enabled()
        if grad and not self._step_open:
            self._start_step()
        if self._sets.factors_on:
            self._factors.enable()  # capture from the DDP's forwards until the layer's reduction is launched
        with self._meter.waiting():
            if self._early_buffers is not None:
                self._early_buffers.finish()  # launched as the last backward began (overlap_optimizer)
                self._early_buffers = None
            elif self.options.broadcast_buffers and self._size > 1:
                broadcast_coalesced(self._comm, self._synced_buffers(), f"{self._prefix}.buffers")
        tl = timeline.active()
        t0 = timeline.now_us() if tl is not None else 0.0
        out = self.module(*inputs, **kwargs)  # with overlap_optimizer, modules' pre-hooks land their updates
        if tl is not None and self._traces_steps:
            tl.span("forward", "FORWARD", t0, timeline.now_us())
        if self._overlap is not None:
            self._overlap.finish_forward(out)
        if grad:
            self._prepare(out if self.require_backward_grad_sync else None)
        return out

    def overlap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Let a backward's averages overlap the next forward (needs ``priority=``); returns ``optimizer``
        with ``step``/``zero_grad`` patched to be recorded and land per parameter in the forward pre-hook
        of the module registering it (:mod:`~ringlet.torch.training.overlap`: the synchronous math, step
        for step). Call it before creating schedulers on ``optimizer``; several optimizers with disjoint
        parameters may be added. Until the next forward, pending ``.grad`` and parameters hold old values:
        :meth:`synchronize` before reading them (clipping, unscaling, saving; ``state_dict()`` does it).
        ``ValueError`` without ``priority=`` or with ``find_unused_parameters=True`` (its usage map comes
        after every piece); errors of :meth:`OptimizerOverlap.add` for an optimizer it refuses."""
        if self.options.priority is None:
            raise ValueError("overlap_optimizer needs DistributedDataParallel(..., priority=ringlet.torch.Priority()): "
                             "first-in-first-out sends the front layers' gradients last, so the next forward "
                             "would wait for all of them.")
        if self.options.find_unused_parameters:
            raise ValueError("overlap_optimizer is not supported with find_unused_parameters=True.")
        if self._overlap is None:
            self._overlap = OptimizerOverlap(self.module, self._params, self._launch, self._names)
        self._overlap.add(optimizer)
        return optimizer

    def synchronize(self) -> None:
        """Land every average, optimizer update and zeroing still in flight (:meth:`overlap_optimizer`);
        call it before reading parameters or gradients outside a forward, e.g. at the end of training.
        Does nothing otherwise."""
        if self._overlap is not None:
            self._overlap.flush()

    @property
    def _tuner(self):
        """The step tuner's :class:`~ringlet.tuning.OnlineChoice` (for tests and reports)."""
        return self._steps.choice

    @property
    def _buckets(self):
        return self._sets.active.buckets

    # ---- steps and bucket sets -----------------------------------------------------------------------
    def _start_step(self) -> None:
        """At the first forward of a step: time the last one (and switch when the tuner decides), rebuild
        the buckets after the first reduced backward, pick the bucket set of this step."""
        if self._traces_steps:
            timeline.mark_step()
        self._step_open = True
        self._meter.begin_step()  # the buffers' broadcast in forward counts as a wait
        decision = self._steps.step_started()
        if decision is not None:
            self._switch(decision)
        if self._arrivals.due:
            self._rebuild_buckets()
        if self._adjust is not None:
            self._adapt()
        if self._sets.activate(bool(self._factors.chosen) and self._steps.wants_factors()):
            self._factors.reset_capture()

    def _switch(self, decision) -> None:
        """Apply the tuner's decision: the bucket set not chosen is dropped (its buffers, and the factor
        capture when dense won). With ``sufficient_factors=True`` the factors were not on trial."""
        per_rank = self._steps.per_rank_ms(decision, self._size)
        log.info("DistributedDataParallel: all-reduce algorithm %r (median step ms per candidate: %s)", decision.choice, per_rank)
        timeline.instant("tuning", "choose_algorithm", {"choice": decision.choice, "step_ms": per_rank})
        if self._retrial_from is None:
            step_clock.switched("algorithm")  # a re-trial's decision is counted by the adjuster's report
        else:
            self._adjust.report(Switch("algorithm", self._retrial_from, decision.choice,
                                       f"re-trial, median step ms per candidate: {per_rank}"))
            self._retrial_from = None
        if self._sets.factored is None:
            return
        if self._steps.rejects_factors(decision):
            self._factors.drop()
            self._sets.drop_factored()
        else:
            self._sets.drop_dense()

    def _adapt(self) -> None:
        """Dynamic adjustment at the start of a step: take the measurements in; on a round, apply the agreed
        corrections (a new bucket cap rebuilds the buckets now). See :mod:`~ringlet.torch.training.adapt`."""
        adj = self._adjust
        if not adj.due(self._steps.choice.decision is not None):
            adj.drain()
            return
        if self._overlap is not None:
            self._overlap.flush()  # nothing in flight crosses a switch
        active = self._sets.active
        gradient = sum(p.numel() * p.element_size() for b in active.buckets if b.reduction is self._dense
                       for p in b.params)
        for e in adj.round(self._launch.messages(active), gradient, self._plan.cap_bytes, self._steps.algorithm):
            if e.op == "bucket_bytes":
                self._plan.resize(self._sets, int(e.new), self._factors.chosen)
            elif e.op == "trial":
                self._retrial_from = self._bucket_algorithm()
                plan = dataclasses.replace(self._trial_plan(), factors=False, network=adj.adaptive.link_network())
                self._steps = StepTuner(plan.candidates(), self._sum_across_ranks)
                adj.released = False

    def _rebuild_buckets(self) -> None:
        """Once, at the forward after the first reduced backward: bucket in rank 0's gradient-arrival order
        (:meth:`BucketPlan.rebuild`)."""
        chosen = self._plan.rebuild(self._sets, self._arrivals, self._factors, self._comm, self._size, self._prefix)
        if not chosen:
            self._steps.drop_factors()

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
            self._arrivals.start()
            active = self._sets.active
            self._reducer.start(active, [p.grad is None for p in active.params])
            if self.options.find_unused_parameters:
                reached = params_reached(out)
                self._unused = [p for p in self._params if id(p) not in reached]

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        if not self._armed:
            return
        with self._lock:
            if not self._in_backward:
                self._in_backward = True
                self._t_first = timeline.now_us()
                torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
                self._steps.mark_reduced()  # only steps that reduce are timed
                if self._overlap is not None and self.options.broadcast_buffers and self._size > 1:
                    # Buffers do not change in backward: broadcast them now, ahead of the pieces, so that
                    # the next forward does not queue behind every piece of this backward.
                    self._early_buffers = start_coalesced(self._synced_buffers(), f"{self._prefix}.buffers",
                                                          self._comm.broadcast_)
                for q in self._unused:
                    self._reducer.ready(q, None)
            self._arrivals.record(self._pindex[id(p)])
            self._reducer.ready(p, p.grad)
            self._t_last = timeline.now_us()

    def _finalize(self) -> None:
        """End of backward: launch what is left, wait for every bucket, write the averages into ``.grad``
        (with :meth:`overlap_optimizer`: leave them in flight, pending until the next forward)."""
        self._meter.grads_ready()
        with self._lock:
            missing = self._reducer.complete()  # zeros keep the ranks in step even when this rank is about to raise
            if self.options.find_unused_parameters:
                # How many ranks produced a real gradient per parameter: an all-zero entry keeps .grad as is.
                self._usage = torch.tensor(self._reducer.marks.got_grad, dtype=torch.int32)
                self._usage_work = self._comm.allreduce_(self._usage, ReduceOp.SUM, f"{self._prefix}.usage")
            t_first, t_last = self._t_first, self._t_last
            self._in_backward = False
            self._armed = False
        tl = timeline.active()
        if tl is not None and self._traces_steps:
            tl.span("backward", "BACKWARD", t_first, t_last)
        if self._adjust is not None:
            self._adjust.backward_done((t_last - t_first) * 1e-6)
        if self._overlap is None:
            with self._meter.waiting():
                self._wait_all()
            if tl is not None:
                self._launch.record(tl)
        else:
            self._overlap.begin()
        self._meter.end_step()
        self._step_open = False
        self._arrivals.complete()
        if missing and not self.options.find_unused_parameters:
            names = ", ".join(self._names.get(id(p), "?") for p in missing[:10])
            raise RuntimeError(f"DistributedDataParallel: {len(missing)} parameter(s) received no gradient in "
                               f"this backward ({names}). Pass find_unused_parameters=True if parts of the "
                               "model are unused in some iterations, or make every parameter take part in "
                               "producing the loss.")
        if self._overlap is None:
            self._copy_back()

    def _wait_all(self) -> None:
        """Wait for every bucket (and the usage map), then raise the first error, if any."""
        error: BaseException | None = None
        try:
            self._reducer.wait()
        except BaseException as exc:  # noqa: BLE001 - keep waiting so nothing is left in flight
            error = exc
        if self._usage_work is not None:
            try:
                self._usage_work.wait()
            except BaseException as exc:  # noqa: BLE001
                error = error or exc
            self._usage_work = None
        if error is not None:
            raise error

    def _copy_back(self) -> None:
        if self.options.find_unused_parameters:
            self._reducer.marks.usage = self._usage.tolist()
        self._reducer.deliver()


def _ignored(module: torch.nn.Module) -> frozenset[str]:
    """The names of parameters and buffers DDP leaves alone: ``module._ddp_params_and_buffers_to_ignore``,
    torch DDP's attribute (set by ``torch.nn.parallel.DistributedDataParallel.
    _set_params_and_buffers_to_ignore_for_model``); empty when unset."""
    return frozenset(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))


def _kept(named, ignored: frozenset[str]) -> list[torch.Tensor]:
    return [t for n, t in named if n not in ignored]


def _trainable(module: torch.nn.Module, ignored: frozenset[str] = frozenset()) -> list[torch.nn.Parameter]:
    """The parameters to reduce (trainable, not ``ignored``); raises ``ValueError`` for a sparse one."""
    params = [p for p in _kept(module.named_parameters(), ignored) if p.requires_grad]
    for p in params:
        if p.layout != torch.strided:
            raise ValueError("DistributedDataParallel supports dense parameters only.")
    return params


def _core_initialized() -> bool:
    try:
        _core.runtime()
    except Exception:  # noqa: BLE001 - whatever "not initialised" raises
        return False
    return True

"""``DistributedOptimizer``: the user's optimizer, with gradients averaged across ranks before each step.

Reduction overlaps the backward pass: a hook after each parameter's gradient accumulation hands the
gradient on as soon as the last of ``backward_passes_per_step`` passes has produced it; ``step()`` only
waits for the results. By default gradients are fused into buckets launched in one fixed order on
ringlet's core queue (:mod:`.ordered_grads`: no negotiation round; ``join()`` is served); with
``groups``, ops other than Average/Sum or ``RINGLET_HVD_GRADIENTS=named`` each all-reduce is named after
its parameter and matched by name through the coordinator (ranks whose hooks fire in different orders
still meet). Gradients of several backward passes are summed locally first (scale the loss by
``1 / backward_passes_per_step`` for an average). ``groups`` gathers parameters into grouped all-reduces.

``compression``: Horovod's ``Compression.none`` / ``Compression.fp16`` (a cast around the name-matched
all-reduce), or a ringlet :class:`~ringlet.compression.Compressor` (or its name), whose reductions go
through the compressed all-reduce in a fixed order instead, one bucket per gradient or group (:mod:`.ordered_grads`).
"""
from __future__ import annotations

import contextlib
import os
import warnings

import torch

from ringlet import collectives as _core
from ringlet import straggler, timeline
from ringlet.types import ReduceOp

from ringlet import compression as _ringlet_compression

from . import context as _context
from . import mpi_ops
from .basics import size as _world_size
from .comm import ORDERED_QUEUE, Comm
from .fused_factors import FusedFactors
from .fused_factors import parse_mode as parse_factors_mode
from .ordered_grads import FusedGradients
from .compression import Compression
from .name_matched import NAME_MATCHED
from .process_sets import global_process_set

_STEP_AFTER_SYNC = ("optimizer.step() called without optimizer.skip_synchronize() after "
                    "optimizer.synchronize(): the gradients are reduced a second time, which is wasted work. "
                    "Wrap step() in `with optimizer.skip_synchronize():` after an explicit synchronize().")
_ZERO_GRAD_PENDING = ("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                      "optimizer.synchronize(): gradient reductions are still in flight. Call step() (or "
                      "synchronize()) first.")
_TOO_MANY_PASSES = ("Gradients were computed more than backward_passes_per_step times before optimizer.step() "
                    "or synchronize(). Raise backward_passes_per_step to accumulate gradients locally.")


class _DistributedOptimizer:
    """Methods mixed in front of the user's optimizer class (see :func:`DistributedOptimizer`)."""

    def _ringlet_setup(self, named_parameters, compression, backward_passes_per_step, op,
                       gradient_predivide_factor, groups, sparse_as_dense, process_set, sufficient_factors):
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._parameter_names = _names(self.param_groups, named_parameters)
        self._pending: set = set()        # parameters whose gradient of this step is accumulating or reducing
        self._allreduce_delay: dict = {}  # param -> backward passes still to come before reducing
        self._grad_hooks = []
        self._requires_update: list = []
        self._synchronized = False
        self._should_synchronize = True
        self._warned_step_after_sync = False
        self._hook_span: list[float] | None = None  # [first, last] hook time of this step (timeline on)
        self._group_of: dict = {}
        self._groups: list[list] = []
        self._sparse_dim: dict = {}  # param -> sparse_dim of its gradient, reduced as dense (sparse_as_dense)
        self._comm: Comm | None = None  # dense reductions go through the training seam
        hooked = process_set.included() and _world_size() > 1
        self._meter = straggler.meter() if hooked else straggler.NullMeter()  # step times (straggler detection)
        if hooked:
            self._register_hooks()
        self._groups = _make_groups(groups, self._requires_update)
        for gi, members in enumerate(self._groups):
            for p in members:
                self._group_of[p] = gi
        self._ordered: FusedGradients | None = None  # the shared bucket reducer's front; None: no hooks
        if hooked:
            # The launch order is fixed (ordered queue) unless Horovod's name matching is needed.
            named = not _is_ringlet_compressor(compression) and not self._fixed_order()
            self._comm = Comm(process_set, algorithm=self._dense_algorithm(named),
                              scheduler=NAME_MATCHED if named else ORDERED_QUEUE)
            self._ordered = self._fused(process_set, sufficient_factors)

    def _fused(self, process_set, sufficient_factors) -> FusedGradients:
        """The shared bucket reducer with Horovod's semantics: fused buckets in a fixed order (factors only
        with Average and ``Compression.none``); with a ringlet compressor one bucket per parameter or
        group, in a fixed order; on the name-matched path the same units, matched by name."""
        pre, post = self._scale()
        world = process_set.ranks == list(range(_world_size()))
        compressor, units, factors = None, None, None
        register = None if self._comm.coordinated else (lambda fused: _register_fused(fused, world))
        if _is_ringlet_compressor(self._compression):
            compressor, units = _ringlet_compression.get(self._compression), self._units()
        elif self._comm.coordinated:
            units = self._units()
        else:
            plain = self.op == mpi_ops.Average and self._compression is Compression.none
            factors = FusedFactors(self._requires_update, self._parameter_names,
                                   sufficient_factors if plain else "off", self._comm.size)
        return FusedGradients(self._comm, self._requires_update, self._parameter_names, ReduceOp(self.op),
                              self._compression, self._sparse_reduce, prescale=pre, postscale=post,
                              register=register, factors=factors,
                              compressor=compressor, units=units)

    def _dense_algorithm(self, named: bool) -> str:
        """The all-reduce algorithm of the fused, uncompressed buckets: the backend's own (``"native"``, as
        Horovod over Gloo runs Gloo's) where the transport declares every parameter's dtype for it, no
        cost model is installed to rank ringlet's schedules against it, the process set is the world (the
        only group the backend's own all-reduce runs over) and neither ``RINGLET_ALGORITHM`` nor a
        coordinator chooses; otherwise ``"auto"``. ringlet's DDP decides the same question by a timed
        trial (docs/training.md, "The step tuner"); benchmarks/training_ddp measures both."""
        rt = _core.runtime()
        native = (not named and self._compression is Compression.none
                  and self.process_set.ranks == list(range(_world_size()))
                  and rt.selector.model is None and _core.resolve_algorithm("auto", rt) == "auto"
                  and rt.transport.capabilities.native_takes(self._requires_update))
        return "native" if native else "auto"

    def _fixed_order(self) -> bool:
        """Whether the plain reductions are fused and launched in a fixed order (no ``groups``, op Average
        or Sum, ``RINGLET_HVD_GRADIENTS`` not ``named``); otherwise each is matched by name."""
        return (not self._groups and self.op in (mpi_ops.Average, mpi_ops.Sum)
                and os.environ.get("RINGLET_HVD_GRADIENTS", "fused") != "named")

    def _units(self) -> list[list]:
        """The units of the compressed and the name-matched reductions, in launch order: each group, or
        each parameter outside the groups, in reverse parameter order (about the order backward produces
        them)."""
        units, seen = [], set()
        for p in reversed(self._requires_update):
            gi = self._group_of.get(p)
            if gi is None:
                units.append([p])
            elif gi not in seen:
                seen.add(gi)
                units.append(self._groups[gi])
        return units

    # ---- hooks -----------------------------------------------------------------------------------
    def _register_hooks(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.append(p)
                    self._allreduce_delay[p] = self.backward_passes_per_step
                    self._grad_hooks.append(p.register_post_accumulate_grad_hook(self._hook))

    def _hook(self, p) -> None:
        tl = timeline.active()
        if tl is not None:
            now = timeline.now_us()
            if self._hook_span is None:
                self._hook_span = [now, now]
            else:
                self._hook_span[1] = now
        if p in self._pending and self._allreduce_delay[p] <= 0:
            raise AssertionError(_TOO_MANY_PASSES)
        self._allreduce_delay[p] -= 1
        self._pending.add(p)  # accumulating or reducing: counts as pending for zero_grad()
        if self._allreduce_delay[p] <= 0:
            self._ordered.ready(p, self._dense_grad)

    # ---- reductions ------------------------------------------------------------------------------
    def _scale(self) -> tuple[float, float]:
        if self.op == mpi_ops.Average:
            # Dividing before the sum keeps fp16 sums in range; the factor is undone after it (and
            # Average's 1/size is applied by the collective itself).
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _dense_grad(self, p) -> torch.Tensor:
        if p.grad is None:
            p.grad = torch.zeros_like(p)  # a parameter this rank did not use still takes part
        elif p.grad.is_sparse and self.sparse_as_dense:
            self._sparse_dim[p] = p.grad.sparse_dim()
            p.grad = p.grad.to_dense()
        return p.grad

    def _resparsify(self) -> None:
        """sparse_as_dense: give parameters whose gradient arrived sparse (every parameter, for an optimizer
        that only takes sparse gradients) a sparse gradient again: the rows of the reduced gradient that
        are not all zero."""
        if not self.sparse_as_dense:
            return
        if isinstance(self, torch.optim.SparseAdam):
            for p in self._requires_update:
                if p.grad is not None and p.grad.dim() > 0 and not p.grad.is_sparse and p not in self._sparse_dim:
                    self._sparse_dim[p] = 1
        for p, sparse_dim in self._sparse_dim.items():
            if p.grad is not None and not p.grad.is_sparse:
                p.grad = p.grad.to_sparse(sparse_dim)
        self._sparse_dim.clear()

    def _sparse_reduce(self, p, grad):
        """Start the name-matched reduction of ``p``'s sparse gradient; returns the callable giving it."""
        return mpi_ops.sparse_allreduce_async(grad, name=self._parameter_names[p], op=self.op,
                                              process_set=self.process_set)

    def synchronize(self) -> None:
        """Wait for every gradient reduction of this step, starting those that have not started
        (parameters whose hook never fired take part with zero gradients), and write the results into
        ``p.grad``. ``step()`` calls it unless inside :meth:`skip_synchronize`."""
        if not self._requires_update:
            self._synchronized = True
            return
        self._meter.grads_ready()
        try:
            with self._meter.waiting():
                self._ordered.finish(self._dense_grad)
            self._resparsify()
        finally:
            self._end_step()
        self._synchronized = True

    def _end_step(self) -> None:
        self._sparse_dim.clear()
        self._pending.clear()
        for p in self._requires_update:
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._ordered.reset()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside this block ``step()`` does not synchronize: for scripts that call :meth:`synchronize`
        themselves (e.g. to clip the reduced gradients) before stepping."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """Synchronize (see :meth:`synchronize`), then the wrapped optimizer's step."""
        if self._should_synchronize:
            if self._synchronized and not self._warned_step_after_sync:
                self._warned_step_after_sync = True
                warnings.warn(_STEP_AFTER_SYNC, stacklevel=2)
            self.synchronize()
        self._synchronized = False
        tl = timeline.active()
        if tl is not None and self._hook_span is not None:
            tl.span("backward", "BACKWARD", self._hook_span[0], self._hook_span[1])
        self._hook_span = None
        out = super().step(closure)
        timeline.mark_step()
        self._meter.end_step()
        return out

    def zero_grad(self, *args, **kwargs):
        """The wrapped optimizer's ``zero_grad``; ``AssertionError`` while reductions are pending."""
        if self._pending:
            raise AssertionError(_ZERO_GRAD_PENDING)
        return super().zero_grad(*args, **kwargs)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes are accumulated before gradients are reduced."""
        _check_passes(passes)
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes


def _register_fused(fused: FusedGradients, world: bool) -> int:
    """Number a world optimizer's ``fused`` in the current context (creation order among the world's
    optimizers, the same on every rank) and record it where ``hvd.join()`` looks
    (:meth:`ringlet.torch.basics.Context.serve_join`). An optimizer of a smaller process set exists on its
    members only, so it is neither counted nor served: 0."""
    if not world:
        return 0
    ctx = _context.context()
    ctx.fused_serial += 1
    ctx.fused_gradients[ctx.fused_serial] = fused
    return ctx.fused_serial


def _is_ringlet_compressor(compression) -> bool:
    return isinstance(compression, (str, _ringlet_compression.Compressor))


def _check_reduction(op, passes, gradient_predivide_factor, compression) -> None:
    """DistributedOptimizer's ``op``, ``backward_passes_per_step``, ``gradient_predivide_factor`` and
    ``compression``, each alone and together (``ValueError``; ``NotImplementedError`` for Adasum)."""
    if op == mpi_ops.Adasum:
        raise NotImplementedError("Adasum is not implemented by ringlet; use op=hvd.Average or hvd.Sum.")
    if op not in (mpi_ops.Average, mpi_ops.Sum, mpi_ops.Min, mpi_ops.Max, mpi_ops.Product):
        raise ValueError(f"Unknown reduction op {op!r}.")
    _check_passes(passes)
    if gradient_predivide_factor != 1.0 and op != mpi_ops.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if gradient_predivide_factor <= 0:
        raise ValueError(f"gradient_predivide_factor must be positive, got {gradient_predivide_factor}.")
    if _is_ringlet_compressor(compression):
        _ringlet_compression.get(compression)  # an unknown name raises here
        if op not in (mpi_ops.Average, mpi_ops.Sum):
            raise ValueError("A ringlet compressor sums or averages gradients; use op=hvd.Average or hvd.Sum.")


def _check_passes(passes) -> None:
    if not isinstance(passes, int) or passes <= 0:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got {passes!r}.")


def _names(param_groups, named_parameters) -> dict:
    params = [p for g in param_groups for p in g["params"]]
    if named_parameters is None:
        return {p: f"allreduce.noname.{gi}.{i}" for gi, g in enumerate(param_groups)
                for i, p in enumerate(g["params"])}
    named = list(named_parameters)
    if any(not isinstance(x, tuple) or len(x) != 2 for x in named):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, usually "
                         "produced by model.named_parameters().")
    names = [n for n, _ in named]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: {', '.join(dups)}")
    by_param = {p: n for n, p in named}
    unnamed = [p for p in params if p not in by_param]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                         f"Python object ids: {', '.join(str(id(p)) for p in unnamed)}")
    return {p: by_param[p] for p in params}


def _make_groups(groups, params: list) -> list[list]:
    """Parameter groups for grouped all-reduces: ``groups`` as an int splits ``params`` (those with hooks)
    into that many contiguous groups; as a list of lists of parameters it is taken as is."""
    if groups is None:
        return []
    if isinstance(groups, int):
        n = min(groups, len(params))
        if n <= 0:
            return []
        base, extra = divmod(len(params), n)
        out, start = [], 0
        for i in range(n):
            end = start + base + (1 if i < extra else 0)
            out.append(params[start:end])
            start = end
        return out
    hooked = set(params)
    return [[p for p in members if p in hooked] for members in groups if any(p in hooked for p in members)]


def _check_groups(groups, param_groups) -> None:
    if groups is None:
        return
    if isinstance(groups, bool) or not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a positive integer or a list of lists of torch.Tensor.")
    if isinstance(groups, list):
        known = {p for g in param_groups for p in g["params"]}
        seen = set()
        for members in groups:
            if not isinstance(members, (list, tuple)):
                raise ValueError("groups should be a positive integer or a list of lists of torch.Tensor.")
            for p in members:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if p in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                if p not in known:
                    raise ValueError("groups contains a tensor that is not a parameter of the optimizer.")
                seen.add(p)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=mpi_ops.Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=global_process_set,
                         sufficient_factors=None):
    """Wrap ``optimizer`` so that ``step()`` applies gradients reduced over ``process_set``.

    Returns an instance of a subclass of ``type(optimizer)`` sharing its parameter groups and state
    (keep using the returned object). ``named_parameters`` (``model.named_parameters()``) names the
    reductions; without it they are ``allreduce.noname.<group>.<index>``. ``op``: ``Average`` (default),
    ``Sum``; ``gradient_predivide_factor`` splits the averaging into a division before and after the
    sum (``Average`` only). ``groups``: an int (that many grouped all-reduces) or a list of lists of
    parameters; ``num_groups`` is its deprecated name. ``sparse_as_dense`` reduces sparse gradients as
    dense tensors and turns the result back into a sparse gradient (its rows that are not all zero) before
    the step, so optimizers that take only sparse gradients (``SparseAdam``) work; otherwise sparse
    gradients are all-gathered. Hooks are only installed when the job has more
    than one rank.

    ``compression``: ``Compression.none`` (default) or ``Compression.fp16`` as in Horovod (floating
    gradients travel as float16 and are cast back), or a ringlet
    :class:`~ringlet.compression.Compressor` or compressor name (``"fp16"``, ``"int8+ef"``,
    ``"powersgd"``...): each gradient or group then goes through the compressed all-reduce (float32
    accumulation, the compressor's state kept per gradient), launched in a fixed order rather than
    matched by name (:mod:`ringlet.torch.ordered_grads`); ``op`` must be ``Average`` or ``Sum``
    (``ValueError`` otherwise, and for an unknown name).

    ``sufficient_factors`` (a ringlet extension; default ``RINGLET_HVD_FACTORS`` or ``"auto"``): large
    ``nn.Linear`` weights averaged from every rank's layer inputs and output gradients instead of
    all-reduced, exact up to rounding and checked every step (:mod:`ringlet.torch.fused_factors`):
    ``"auto"`` where steps with them are faster (timed against the dense reduction in the first steps),
    ``True``/``"on"`` always, ``False``/``"off"`` never.
    It applies to the default fused path with ``op=Average`` and ``Compression.none``; every rank must
    pass the same value. ``ValueError`` for another value.
    """
    if sufficient_factors is None:
        sufficient_factors = os.environ.get("RINGLET_HVD_FACTORS", "auto")
    factors_mode = parse_factors_mode(sufficient_factors)
    _check_reduction(op, backward_passes_per_step, gradient_predivide_factor, compression)
    if num_groups != 0:
        warnings.warn("num_groups is deprecated; use groups=.", DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    _check_groups(groups, optimizer.param_groups)
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedOptimizer, base),
               {"__module__": __name__, "_ringlet_base_step": base.step, "__doc__": base.__doc__})
    # Share the user's optimizer's attributes (param groups, state, hooks, defaults) instead of running
    # its __init__ again: optimizers with required constructor arguments work, and state carries over.
    obj = cls.__new__(cls)
    obj.__dict__.update(optimizer.__dict__)
    obj._ringlet_setup(named_parameters, compression, backward_passes_per_step, op, gradient_predivide_factor,
                       groups, sparse_as_dense, process_set, factors_mode)
    return obj


__all__ = ["DistributedOptimizer"]

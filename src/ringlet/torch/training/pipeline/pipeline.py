"""``ringlet.torch.Pipeline``: an ``nn.Sequential`` cut into stages over the ranks, micro-batches flowing
through them, each stage's gradients averaged over its replicas by ringlet's DDP. docs/pipeline.md."""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable

import torch

import ringlet
from ringlet import collectives as _core
from ringlet import straggler

from ..ddp import DistributedDataParallel
from .boundary import MAX_MICROBATCHES
from .schedules import SCHEDULES
from .split import check_balance, even_balance, layer_ranges, stage_module
from .stage import StageRunner, StepStats, _Step

__all__ = ["Pipeline"]


def _reduce_spans(ddp: DistributedDataParallel) -> tuple[tuple[float, float], ...]:
    """The ``(start, end)`` (timeline microseconds) of each of ``ddp``'s bucket reductions of the step just
    ended, as the communication thread ran them (a bucket without a recorded span is left out)."""
    spans = (getattr(b.work, "span", lambda: None)() for b in ddp._buckets if b.work is not None)
    return tuple(s for s in spans if s is not None)


def _positive_int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{what} must be a positive int, got {v!r}.")
    return v


class Pipeline:
    """Stage ``rank // R`` of ``module`` cut into ``stages`` contiguous parts, on a world of ``stages × R``
    ranks: rank ``stage * R + replica`` (the replicas of a stage are neighbouring ranks, so a host holding
    them averages their gradients locally; a replica's stages are ``R`` ranks apart).

    ``module``: an ``nn.Sequential`` (the same on every rank; only this stage's layers are kept, so the
    caller may drop the rest). ``stages``: S, dividing the world. ``microbatches``: M, dividing every
    batch. ``schedule``: ``"1f1b"`` or ``"gpipe"`` (:mod:`.schedules`). ``balance``: layers per stage
    (default: even by parameter count, :func:`.split.even_balance`). ``sync_replicas``: average each
    stage's gradients over its R replicas by a :class:`DistributedDataParallel` over :attr:`replica_group`
    (reducing only in the last backward of a step); False leaves them this replica's, for an optimizer that
    averages them itself (``ZeroOptimizer(..., options=ZeroOptions(group=pipe.replica_group))``).
    ``compression`` and ``ddp_options``: handed to that DDP.

    Every rank of the world must construct it at the same point (it creates S groups, collectively).
    ``TypeError``: not a Sequential; ``ValueError``: S not dividing the world, fewer layers than stages, a
    bad balance, a bad schedule; a warning when M < S (the bubble dominates).
    """

    def __init__(self, module: torch.nn.Module, stages: int, microbatches: int, schedule: str = "1f1b",
                 balance=None, *, sync_replicas: bool = True, compression=None, **ddp_options: Any):
        if not isinstance(module, torch.nn.Sequential):
            raise TypeError(f"Pipeline splits an nn.Sequential, got {type(module).__name__}; wrap the layers "
                            "in torch.nn.Sequential.")
        self.stages = _positive_int(stages, "stages")
        self.microbatches = _positive_int(microbatches, "microbatches")
        if microbatches > MAX_MICROBATCHES:
            raise ValueError(f"at most {MAX_MICROBATCHES} micro-batches, got {microbatches}.")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}.")
        self.schedule = schedule
        rt = _core.runtime()
        if rt.size % stages:
            raise ValueError(f"{stages} stages do not divide the world of {rt.size} ranks.")
        self.replicas = rt.size // stages
        self.stage, self.replica = divmod(rt.rank, self.replicas)
        self.balance = self._balance(module, balance)
        self.layers = layer_ranges(self.balance)[self.stage]
        self.module = stage_module(module, *self.layers)
        if microbatches < stages:
            warnings.warn(f"Pipeline: {microbatches} micro-batches for {stages} stages; the bubble "
                          f"(S-1)/(M+S-1) = {(stages - 1) / (microbatches + stages - 1):.0%} of each step dominates.",
                          stacklevel=2)
        groups = [ringlet.new_group([s * self.replicas + r for r in range(self.replicas)]) for s in range(stages)]
        self.replica_group = groups[self.stage]
        self.ddp = self._wrap(sync_replicas, compression, ddp_options)
        forward = self.ddp if self.ddp is not None else self.module
        no_sync = self.ddp.no_sync if self.ddp is not None else contextlib.nullcontext
        arm = self.ddp.prepare_for_backward if self.ddp is not None else None
        prev = rt.rank - self.replicas if self.stage > 0 else None
        nxt = rt.rank + self.replicas if self.stage < stages - 1 else None
        self._runner = StageRunner(self.stage, stages, prev, nxt, forward, no_sync, arm)
        # Straggler detection: the waits on the neighbouring stages are waits, and only the replicas of a
        # stage (the same work) are compared, whoever meters the steps (the DDP here, or a ZeroOptimizer).
        self._runner.meter = straggler.meter()
        self._runner.meter.cohort = f"pipeline stage {self.stage}"
        self._actions = SCHEDULES[schedule](self.stage, stages, microbatches)
        self._failed: BaseException | None = None  # a step that failed once it had begun to communicate

    def _balance(self, module: torch.nn.Sequential, balance) -> list[int]:
        n = len(module)
        if n < self.stages:
            raise ValueError(f"the Sequential has {n} layers, fewer than the {self.stages} stages.")
        if balance is not None:
            return check_balance(balance, n, self.stages)
        return even_balance([sum(p.numel() for p in layer.parameters()) for layer in module], self.stages)

    def _wrap(self, sync: bool, compression, options: dict) -> DistributedDataParallel | None:
        if not sync:
            if compression is not None or options:
                raise ValueError("compression and DDP options need sync_replicas=True (the pipeline's DDP).")
            return None
        if self.replicas == 1:
            return None
        params = [p for p in self.module.parameters() if p.requires_grad]
        if not params:
            return None
        return DistributedDataParallel(self.module, group=self.replica_group, compression=compression, **options)

    # ---- properties ----------------------------------------------------------------------------------------
    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1

    @property
    def stats(self) -> StepStats:
        """The last step's :class:`~.stage.StepStats` on this rank."""
        return self._runner.stats

    def parameters(self):
        """This stage's parameters, in the Sequential's order."""
        return self.module.parameters()

    def named_parameters(self):
        """This stage's parameters with their names in the whole Sequential (``"4.weight"``)."""
        return self.module.named_parameters()

    # ---- training --------------------------------------------------------------------------------------
    def step(self, x: torch.Tensor | None, y: torch.Tensor | None, loss_fn: Callable, *, scaler=None) -> float | None:
        """Forward and backward of this replica's batch in M micro-batches (dim 0 split evenly). The first
        stage reads ``x``, the last ``y`` and ``loss_fn(output, y_micro)`` (a scalar mean over the
        micro-batch); other ranks may pass None. Returns the mean loss on the last stage, None elsewhere.
        When it returns, ``.grad`` holds the gradients of the mean loss over the batch (the sum of the
        micro-batches' ``loss / M``), averaged over the replicas; call ``zero_grad`` between steps as usual.
        ``scaler``: a :class:`~ringlet.torch.GradScaler` whose scale multiplies the losses (its overflow
        verdict over the world keeps every stage's scale equal). ``ValueError`` for a missing input or
        target, a batch that M does not divide, x and y of different batch sizes (raised on the last stage;
        its neighbours then fail by ``RINGLET_TIMEOUT``). An error once the step has begun to communicate
        leaves the pipeline unusable: later steps raise ``RuntimeError``."""
        rows = 0
        xs = ys = None
        if self.is_first:
            xs = self._split(x, "x")
            rows = x.shape[0]
        if self.is_last:
            ys = self._split(y, "y")
            if self.is_first and y.shape[0] != rows:
                raise ValueError(f"x has {rows} rows but y has {y.shape[0]}: they must have the same batch size.")
            rows = y.shape[0]
        if self._failed is not None:
            raise RuntimeError(f"an earlier step of this pipeline failed ({self._failed!r}); messages of that "
                               "step may still be posted, so it cannot run another.") from self._failed
        try:
            loss = self._runner.run(self._actions, _Step(xs, ys, loss_fn, scaler, rows), self.microbatches)
        except BaseException as exc:
            self._failed = exc
            raise
        if self.ddp is not None:
            self._runner.stats.allreduce_spans = _reduce_spans(self.ddp)
        return loss

    def _split(self, t, what: str) -> list[torch.Tensor]:
        stage = "first" if what == "x" else "last"
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"the {stage} stage (rank {_core.runtime().rank}) needs {what} as a tensor, got "
                             f"{type(t).__name__}.")
        if t.dim() == 0 or t.shape[0] % self.microbatches:
            raise ValueError(f"{what} has {t.shape[0] if t.dim() else 0} rows, not divisible into "
                             f"{self.microbatches} micro-batches.")
        return list(t.split(t.shape[0] // self.microbatches))

    # ---- checkpoints -----------------------------------------------------------------------------------------
    def _layout(self) -> dict:
        return {"stages": self.stages, "stage": self.stage, "layers": list(self.layers)}

    def state_dict(self) -> dict:
        """This stage's part: ``{"pipeline": layout, "module": state_dict}``; the module's keys are the whole
        Sequential's (``"4.weight"``), so the stages' dicts merged are the model's."""
        return {"pipeline": self._layout(), "module": self.module.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Load a :meth:`state_dict` saved by the same stage of the same layout; ``ValueError`` otherwise."""
        if not isinstance(state, dict) or "pipeline" not in state or "module" not in state:
            raise ValueError("not a Pipeline state dict (it needs the keys 'pipeline' and 'module').")
        saved = dict(state["pipeline"])
        saved["layers"] = list(saved.get("layers", ()))
        if saved != self._layout():
            raise ValueError(f"this checkpoint holds stage {saved.get('stage')} of {saved.get('stages')} (layers "
                             f"{saved['layers']}), but this rank is stage {self.stage} of {self.stages} (layers "
                             f"{list(self.layers)}); load it into the same layout.")
        self.module.load_state_dict(state["module"])

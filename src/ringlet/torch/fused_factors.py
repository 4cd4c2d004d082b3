"""Sufficient factors on ``DistributedOptimizer``'s fused path: a large ``nn.Linear`` weight's average
gradient gathered as every rank's layer inputs and output gradients instead of all-reduced, as ringlet's
DDP does (the mathematics, the capture and the guard: :mod:`ringlet.torch.training.factors`). The result
is the average of the ranks' gradients up to rounding, so a Horovod script sees the same ``.grad``.

The optimizer has no model, so the layers are found from its parameters: while the first step's forward
runs, a global module forward hook notes each ``nn.Linear`` (nn.Linear's own ``forward``, a dense 2-D
float32/float64 weight) whose weight the optimizer holds, and how many rows it saw; a weight seen in two
modules is left out. At the end of the first step every rank votes, per parameter, whether its gathered
factors would be fewer numbers than its gradient (``p·rows·(in+out) < in·out``), in one all-reduce; a
weight is factored from the second step on only if every stepping rank voted for it (a rank inside
``hvd.join()`` votes with zeros and counts as not stepping). Each factored weight is then a bucket of its
own in the launch order, reduced by the training layer's factor strategy
(:class:`~ringlet.torch.training.take_reduction.TakeFactors`).

Every step each rank checks that its own factors reproduce the gradient autograd accumulated; if any
rank's do not (the weight used outside its layer, a ``.grad`` that held values before the step), every
rank takes the dense average for that step, and the weight is reduced densely from the next step on.
All ranks see the same verdicts, so they change layout together.

``mode``: ``"on"`` factors every layer that qualifies; ``"auto"`` then times steps with and without the
factors in turn and keeps them only if they are faster by more than 3%, as ringlet's DDP does
(:class:`~ringlet.tuning.StepTuner`: five steps each, up to twenty while too close to call; the
statistics summed over ranks, so every rank decides the same); ``"off"`` never. Factors apply only to
``op=Average`` with ``Compression.none``.
"""
from __future__ import annotations

import weakref
from typing import Callable

import torch

from ringlet.tuning.online import Decision
from ringlet.tuning.step_tuner import FACTORS, StepTuner

from .training import factors as _factors

__all__ = ["FusedFactors", "parse_mode", "MODES"]

MODES = ("auto", "on", "off")
_TIED = -1


def parse_mode(value) -> str:
    """``True``/``False``/``"auto"``/``"on"``/``"off"`` as a mode; ``ValueError`` for anything else."""
    mode = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
    if mode not in MODES:
        raise ValueError(f"sufficient_factors must be True, False, 'auto', 'on' or 'off', got {value!r}")
    return mode


class FusedFactors:
    """The factored weights of one fused ``DistributedOptimizer`` (see the module doc). ``params``: its
    parameters in order; ``names``: param -> name; ``size``: ranks in its group when built; ``mode``: as in the
    module doc, ``"off"`` where the optimizer's op or compression rules factors out. :attr:`active` is
    the same on every rank (a function of the arguments). ``tuner``: the trial against the dense
    reduction (``"auto"``, while it runs); ``decision``: its outcome."""

    def __init__(self, params: list[torch.Tensor], names: dict, mode: str, size: int):
        self.params, self.names, self.mode = params, names, mode
        self.active = size > 1 and mode in ("on", "auto")
        self.tuner: StepTuner | None = None
        self.decision: Decision | None = None
        self._index = {id(p): i for i, p in enumerate(params)}
        self.layers: dict[int, _factors.FactoredLinear] = {}  # id(weight) -> capture, found in step 1
        self._module_of: dict[int, int] = {}  # id(weight) -> id(its module), _TIED if seen in two
        self.chosen: dict[int, _factors.FactoredLinear] = {}
        self.decided = False
        self._hook = _global_forward_hook(self) if self.active else None

    # ---- finding the layers (first step) ---------------------------------------------------------
    def _discover(self, module, args, out) -> None:
        w = getattr(module, "weight", None)
        if w is None or id(w) not in self._index or not isinstance(module, torch.nn.Linear):
            return
        seen = self._module_of.setdefault(id(w), id(module))
        if seen != id(module):
            self._module_of[id(w)] = _TIED
            return
        if not (args and torch.is_grad_enabled() and isinstance(out, torch.Tensor) and out.requires_grad):
            return
        layer = self.layers.get(id(w))
        if layer is None:
            if not _factors.eligible(module):
                return
            layer = self.layers[id(w)] = _factors.FactoredLinear(self.names[w], module)
        layer.rows = args[0].numel() // layer.in_features if layer.in_features else 0

    def stop_discovery(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def vote(self, stepping: bool, size: int) -> torch.Tensor:
        """``[stepping, worth per parameter, found per parameter, 1]`` of this rank (float64, summed over
        ranks): ``worth`` only from a stepping rank (on ``size`` ranks, the group's now), ``found`` (this
        rank holds a capture for the layer, so it can take part in its gather) from every rank, and the
        last slot counts the ranks."""
        self.stop_discovery()
        n = len(self.params)
        v = torch.zeros(2 + 2 * n, dtype=torch.float64)
        v[0], v[-1] = float(stepping), 1.0
        for wid, layer in self.layers.items():
            if self._module_of.get(wid) == _TIED:
                continue
            i = self._index[wid]
            v[1 + n + i] = 1.0
            if stepping and _factors.worth_factoring(size, layer.rows, layer.out_features, layer.in_features):
                v[1 + i] = 1.0
        return v

    def decide(self, votes: torch.Tensor) -> None:
        """Choose from the summed votes (identical on every rank): the weights every stepping rank voted
        for and every rank found."""
        self.decided = True
        n, stepping, ranks = len(self.params), round(float(votes[0])), round(float(votes[-1]))
        self.chosen = {id(p): self.layers[id(p)] for i, p in enumerate(self.params)
                       if stepping > 0 and round(float(votes[1 + i])) == stepping
                       and round(float(votes[1 + n + i])) == ranks}
        for wid, layer in self.layers.items():
            if wid in self.chosen:
                layer.enabled = True
            else:
                layer.remove()
        self.layers = dict(self.chosen)

    def reset(self) -> None:
        """A new ringlet session (elastic reset): back to dense until the next first step decides."""
        for layer in self.chosen.values():
            layer.enabled = False
            layer.pairs.clear()
        self.chosen, self.decided = {}, False
        self.tuner = self.decision = None

    # ---- the trial ("auto") --------------------------------------------------------------------------
    def start_trial(self, sum_across_ranks: Callable[[list[float]], list[float]]) -> None:
        """After the vote: with ``"auto"`` and some weight chosen, time the next steps with and without
        factors in turn (the step that ends now is the first timing's start)."""
        if self.mode == "auto" and self.chosen:
            self.tuner = StepTuner(("dense", "dense" + FACTORS), sum_across_ranks)
            self.tuner.step_started()

    def step_ended(self) -> None:
        """A step (stepped or served) ended: time it while on trial; when the ranks decide that the dense
        reduction is as fast, no weight is factored any more."""
        tuner = self.tuner
        if tuner is None:
            return
        tuner.mark_reduced()
        decision = tuner.step_started()
        if decision is None:
            return
        self.tuner, self.decision = None, decision
        if StepTuner.rejects_factors(decision):
            for p in [p for p in self.params if id(p) in self.chosen]:
                self._drop(p)

    def in_use(self) -> dict[int, _factors.FactoredLinear]:
        """The weights the next step reduces from factors (all chosen, or none on a dense trial step);
        only they capture factors in its forward."""
        use = self.chosen if self.tuner is None or self.tuner.wants_factors() else {}
        for wid, layer in self.chosen.items():
            layer.enabled = wid in use
        return use

    # ---- a weight whose factors did not serve -----------------------------------------------------------
    def fell_back(self, layer: _factors.FactoredLinear) -> None:
        """Some rank's factors did not match its gradient (the step took the dense average, on every
        rank): reduce ``layer``'s weight densely from the next step on."""
        p = next((q for q in self.params if self.chosen.get(id(q)) is layer), None)
        if p is not None:
            self._drop(p)

    def _drop(self, p: torch.Tensor) -> None:
        layer = self.chosen.pop(id(p), None)
        self.layers.pop(id(p), None)
        if layer is not None:
            layer.remove()
            layer.enabled = False
            layer.pairs.clear()


def _global_forward_hook(factors: FusedFactors):
    """A global module forward hook calling ``factors._discover``; it holds ``factors`` weakly and removes
    itself once they are gone (an optimizer dropped before its first step)."""
    ref = weakref.ref(factors)

    def hook(module, args, out):
        me = ref()
        if me is None:
            handle.remove()
            return
        me._discover(module, args, out)

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    return handle

"""One rank of the DDP / comm-hook equivalence job:

    ringlet run -np N --transport torch -- python tests/workers/ddp_worker.py OUT.json

Every rank runs the same cases in order and writes ``OUT.json.rank<r>`` with passed/failed cases and a
few numbers. References are computed by every rank itself: the same seeded model trained in one
process on the concatenated global batch (inputs are small integers, so every rank builds every
rank's batch). Parameters must agree within 1e-6 (fp32).

Cases: ringlet's DistributedDataParallel with several buckets and with one; with gradients as bucket views
(both ways of zeroing, with and without accumulation); the default mode's gradients lent from the buckets
(a kept gradient keeps its values, a pre-existing ``.grad`` is updated in place); with no_sync accumulation;
find_unused_parameters (a layer used on even steps only, one never used, one used by rank 0 only);
an unused parameter without the flag raising a clear error, after which training still works; the
initial broadcast of parameters and buffers; stock torch DDP with ringlet's comm hooks against stock
DDP without hooks; a timeline of a DDP run (rank 0 writes it; the test runs ``ringlet report`` on it);
finally the same DDP and hook checks with ``ringlet.torch`` initialised (its coordinator active).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ringlet
from case_harness import run_cases
from ringlet import timeline
from ringlet.torch import hooks
from ringlet.torch.training.ddp import DistributedDataParallel

TOL = 1e-6
B = 4  # per-rank batch
LR = 0.05


class Net(torch.nn.Module):
    def __init__(self, width: int = 16, extra: bool = False):
        super().__init__()
        self.a = torch.nn.Linear(6, width)
        self.b = torch.nn.Linear(width, width)
        self.c = torch.nn.Linear(width, 4)
        self.bn = torch.nn.BatchNorm1d(4, affine=False)  # a buffer-carrying module (running stats)
        if extra:
            self.side = torch.nn.Linear(width, width)   # used on even steps only
            self.dead = torch.nn.Linear(width, 4)       # never used
            self.only0 = torch.nn.Linear(width, width)  # used when the caller says so (rank 0)

    def forward(self, x, step: int = 0, use_only0: bool = False):
        h = F.relu(self.a(x))
        if hasattr(self, "side") and step % 2 == 0:
            h = h + torch.tanh(self.side(h))
        if use_only0:
            h = h + torch.tanh(self.only0(h))
        h = F.relu(self.b(h))
        return self.c(h)


def base_model(extra: bool = False, width: int = 16) -> Net:
    torch.manual_seed(1234)
    return Net(width, extra)


def batch(step: int, world: int, micro: int = 0):
    g = torch.Generator().manual_seed(1000 * step + micro)
    x = torch.randint(-3, 4, (B * world, 6), generator=g).float()
    y = torch.randint(-3, 4, (B * world, 4), generator=g).float()
    return x, y


def mine(t: torch.Tensor, rank: int) -> torch.Tensor:
    return t[rank * B:(rank + 1) * B]


def maxdiff(m1: torch.nn.Module, m2: torch.nn.Module) -> float:
    return max((p.detach() - q.detach()).abs().max().item() for p, q in zip(m1.parameters(), m2.parameters()))


def reference(steps: int, world: int, micro: int = 1, extra: bool = False, momentum: float = 0.9,
              make=None) -> Net:
    """Single-process training on the concatenated batch; with ``micro`` > 1 the step's gradient is the
    mean over the micro-batches (loss / micro each), as accumulation with ``no_sync`` produces."""
    ref = base_model(extra) if make is None else make()
    opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=momentum)
    for s in range(steps):
        opt.zero_grad()
        for m in range(micro):
            x, y = batch(s, world, m)
            (F.mse_loss(ref(x, s), y) / micro).backward()
        opt.step()
    return ref


def train_ddp(ddp, model, steps, rank, world, micro=1, momentum=0.9, set_to_none=True):
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum)
    for s in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        for m in range(micro):
            x, y = batch(s, world, m)
            if m < micro - 1:
                with ddp.no_sync():
                    (F.mse_loss(ddp(mine(x, rank), s), mine(y, rank)) / micro).backward()
            else:
                (F.mse_loss(ddp(mine(x, rank), s), mine(y, rank)) / micro).backward()
        opt.step()


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise AssertionError(msg)


# ---- cases ---------------------------------------------------------------------------------------
def case_equiv(rank, world, bucket_cap_mb, expect_buckets):
    def run(numbers):
        model = base_model()
        ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
        n = len(ddp.bucket_layout)
        check(expect_buckets(n), f"unexpected bucket count {n}: {ddp.bucket_layout}")
        # Reverse registration order: the last layer's parameters sit in the first bucket.
        check(ddp.bucket_layout[0][0].startswith("c."), f"first bucket {ddp.bucket_layout[0]}")
        train_ddp(ddp, model, 4, rank, world)
        d = maxdiff(model, reference(4, world))
        numbers[f"buckets_{bucket_cap_mb}"] = n
        check(d <= TOL, f"max |ddp - single process| = {d}")
    return run


def case_grad_view(rank, world):
    def run(numbers):
        for set_to_none in (True, False):
            for micro in (1, 3):
                model = base_model()
                ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002, gradient_as_bucket_view=True)
                train_ddp(ddp, model, 3, rank, world, micro=micro, set_to_none=set_to_none)
                d = maxdiff(model, reference(3, world, micro=micro))
                check(d <= TOL, f"max |ddp - single process| with gradient views (set_to_none={set_to_none}, "
                                f"micro={micro}) = {d}")
                spans = [(b.buffer.data_ptr(), b.buffer.data_ptr() + b.buffer.numel() * b.buffer.element_size())
                         for b in ddp._buckets]
                outside = [n for n, p in model.named_parameters()
                           if not any(lo <= p.grad.data_ptr() < hi for lo, hi in spans)]
                check(not outside, f"gradients that are not views into a bucket: {outside}")
    return run


def _in_a_bucket(ddp, t: torch.Tensor) -> bool:
    return any(b.buffer.data_ptr() <= t.data_ptr() < b.buffer.data_ptr() + b.buffer.numel() * b.buffer.element_size()
               for b in ddp._buckets)


def case_lent_gradients(rank, world):
    """Default mode: a gradient autograd created is replaced by a view of the average in its bucket (no
    copy back); a bucket whose memory is still held elsewhere is replaced, so a gradient kept across steps
    keeps its values; a ``.grad`` that persists across steps is updated in place, as torch does."""
    def run(numbers):
        for set_to_none in (True, False):
            for micro in (1, 3):
                model = base_model()
                ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002)
                train_ddp(ddp, model, 3, rank, world, micro=micro, set_to_none=set_to_none)
                d = maxdiff(model, reference(3, world, micro=micro))
                check(d <= TOL, f"max |ddp - single process| (set_to_none={set_to_none}, micro={micro}) = {d}")
                outside = [n for n, p in model.named_parameters() if not _in_a_bucket(ddp, p.grad)]
                if micro == 1:  # no_sync created .grad before the synced forward: it is updated in place
                    check(not outside, f"gradients not lent from a bucket: {outside}")
                check(ddp.fresh_buffers == 0, f"{ddp.fresh_buffers} buckets replaced while nothing held them")

        # A gradient kept across a step keeps its values; the step still trains like a single process.
        model = base_model()
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002)
        train_ddp(ddp, model, 1, rank, world)
        kept = model.c.weight.grad
        want = kept.clone()
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        opt.zero_grad()
        x, y = batch(1, world)
        F.mse_loss(ddp(mine(x, rank), 1), mine(y, rank)).backward()
        check(torch.equal(kept, want), "a gradient kept across steps was overwritten by the next step")
        check(ddp.fresh_buffers >= 1, "the bucket holding a kept gradient was reused")
        check(_in_a_bucket(ddp, model.c.weight.grad), "the new gradient is not lent from the new bucket")

        # A .grad that exists before the forward is the same object afterwards, holding the average.
        model = base_model()
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002)
        own = [torch.zeros_like(p) for p in model.parameters()]
        for p, g in zip(model.parameters(), own):
            p.grad = g
        x, y = batch(0, world)
        F.mse_loss(ddp(mine(x, rank)), mine(y, rank)).backward()
        ref = base_model()
        F.mse_loss(ref(x), y).backward()
        for (n, p), g, q in zip(model.named_parameters(), own, ref.parameters()):
            check(p.grad is g, f"{n}: .grad was replaced although it existed before the forward")
            dg = (g - q.grad).abs().max().item()
            check(dg <= TOL, f"{n}: in-place average differs from the single-process gradient by {dg}")
    return run


class Reversed(torch.nn.Module):
    """Registers its layers in the opposite order of use: reverse registration order is backward's
    order reversed, which only the rebuild after the first backward corrects."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(99)
        self.c = torch.nn.Linear(16, 4)
        self.b = torch.nn.Linear(16, 16)
        self.a = torch.nn.Linear(6, 16)

    def forward(self, x, step: int = 0):
        return self.c(F.relu(self.b(F.relu(self.a(x)))))


def case_rebuild_arrival_order(rank, world):
    def run(numbers):
        model = Reversed()
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002)
        check(ddp.bucket_layout[0][0].startswith("a."), f"construction layout {ddp.bucket_layout}")
        train_ddp(ddp, model, 4, rank, world)
        layout = ddp.bucket_layout
        check(layout[0][0].startswith("c.") and layout[-1][-1].startswith("a."),
              f"buckets not rebuilt in gradient-arrival order: {layout}")
        ref = Reversed()
        opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9)
        for s in range(4):
            opt.zero_grad()
            x, y = batch(s, world)
            F.mse_loss(ref(x), y).backward()
            opt.step()
        d = maxdiff(model, ref)
        check(d <= TOL, f"rebuilt DDP vs single process: {d}")
    return run


def case_tuned_algorithm(rank, world):
    """algorithm="auto" on 3+ ranks tries auto and direct (after the backend's own all-reduce, the
    incumbent where the transport declares it) over the first steps, then all ranks keep the same one; training stays
    equivalent to one process throughout. On 2 ranks only the backend's own all-reduce can challenge."""
    def run(numbers):
        model = base_model()
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002)
        ddp._tuner.max_trials = ddp._tuner.trials  # a fixed schedule here; the extension is checked below
        cands = ddp._tuner.candidates
        base = tuple(c for c in cands if not c.endswith("+factors"))
        expected = ("auto", "direct") if world >= 3 else ("auto",)
        native = ringlet.collectives.runtime().transport.capabilities.native_dtypes
        expected = ("native",) + expected if native else expected  # the incumbent where declared
        check(base == expected, f"candidates {cands}, expected {expected}")
        seen = []
        steps = 4 + 5 * len(cands)  # 2 warm-up steps, 5 trials per candidate, then the decision
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        for s in range(steps):
            seen.append(ddp.algorithm)
            opt.zero_grad()
            x, y = batch(s, world, 0)
            F.mse_loss(ddp(mine(x, rank), s), mine(y, rank)).backward()
            opt.step()
        d = maxdiff(model, reference(steps, world))
        check(d <= TOL, f"max |ddp - single process| = {d} (algorithms used: {seen})")
        if len(base) > 1:
            check(set(base) <= set(seen), f"no trial of every candidate: {seen}")
            check(ddp._tuner.decision is not None, f"no decision after {steps} steps")
            mine_ = torch.tensor([base.index(seen[-1])], dtype=torch.int32)
            agree = ringlet.allgather(mine_)
            check(len(set(agree.tolist())) == 1, f"ranks chose differently: {agree.tolist()}")
        else:
            check(set(seen) == set(base), f"tuning on 2 ranks: {seen}")
        numbers["tuned_algorithm"] = seen[-1]
        if world >= 3:
            # The default tuner takes five more trials per candidate while the medians are too close to
            # call (as on a tiny model), up to twenty: every rank extends and decides at the same step.
            model = base_model()
            ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002)
            steps = 0
            while ddp._tuner.decision is None and steps < 2 + len(cands) * 20 + 1:
                train_ddp(ddp, model, 1, rank, world)
                steps += 1
            check(ddp._tuner.decision is not None, f"no decision after {steps} steps")
            done = ddp._tuner.trials_done
            check(5 <= done <= 20 and done % 5 == 0, f"{done} trials per candidate")
            agree = ringlet.allgather(torch.tensor([steps, done, ddp._tuner.candidates.index(
                ddp._tuner.decision.choice)]).reshape(1, 3))
            check(len({tuple(r) for r in agree.tolist()}) == 1, f"ranks differ (steps, trials, choice): {agree.tolist()}")
            numbers["tuner_trials"] = done
        check(DistributedDataParallel(base_model(), algorithm="ring").algorithm == "ring", "explicit algorithm lost")
        rt = ringlet.collectives.runtime()
        options = rt.options
        rt.options = dataclasses.replace(options, algorithm="direct")  # as RINGLET_ALGORITHM=direct at init
        try:
            forced = DistributedDataParallel(base_model())
            check(forced._tuner.current() == "auto" and forced.algorithm == "direct",
                  f"RINGLET_ALGORITHM=direct: trial {forced._tuner.current()!r}, reported {forced.algorithm!r}")
        finally:
            rt.options = options
    return run


def case_accumulation(rank, world):
    def run(numbers):
        model = base_model()
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002)
        # Under no_sync the gradient stays local: compare with this rank's own gradient.
        x, y = batch(0, world)
        with ddp.no_sync():
            F.mse_loss(ddp(mine(x, rank)), mine(y, rank)).backward()
        local = base_model()
        F.mse_loss(local(mine(x, rank)), mine(y, rank)).backward()
        d0 = max((p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), local.parameters()))
        check(d0 == 0.0, f"no_sync gradient differs from the local one by {d0}")
        model.zero_grad()
        train_ddp(ddp, model, 3, rank, world, micro=3)
        d = maxdiff(model, reference(3, world, micro=3))
        check(d <= TOL, f"max |ddp accumulated - single process| = {d}")
    return run


class OutsideUse(Net):
    """Uses ``b.weight`` outside ``b``'s forward too: its gradient is not the factors' product."""

    def forward(self, x, step: int = 0, use_only0: bool = False):
        return super().forward(x, step, use_only0) + 0.1 * self.b.weight.sum()


def wide(extra: bool = False) -> Net:
    """Width 64: the 64 x 64 layers (b, and side and only0) are worth factoring on 4 rows per rank (up
    to 7 ranks); a (6 inputs) and c (4 outputs) never are."""
    return base_model(extra, width=64)


def outside_use_model() -> OutsideUse:
    torch.manual_seed(1234)
    return OutsideUse(64)


def case_sufficient_factors(rank, world):
    """Weight gradients of the linear layers averaged from gathered factors (from the second step on):
    the same training as single-process, with and without accumulation, both ways of zeroing; a weight
    also used outside its layer falls back to the dense all-reduce on every rank; True and "auto" leave
    layers dense whose factors are not fewer numbers than their gradient; "auto" times factors against
    dense where a layer qualifies."""
    def run(numbers):
        for micro in (1, 3):
            for set_to_none in (True, False):
                model = wide()
                ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002, sufficient_factors=True)
                train_ddp(ddp, model, 4, rank, world, micro=micro, set_to_none=set_to_none)
                check(ddp.factored == ["b.weight"], f"factored {ddp.factored}")
                check(ddp.factored_reductions == 3 and ddp.factor_fallbacks == 0,
                      f"{ddp.factored_reductions} factored, {ddp.factor_fallbacks} fallbacks")
                d = maxdiff(model, reference(4, world, micro=micro, make=wide))
                check(d <= TOL, f"max |ddp with factors - single process| = {d} (micro={micro}, "
                      f"set_to_none={set_to_none})")
                numbers[f"factors_diff_{micro}_{set_to_none}"] = d
        # The average's memory is reused for the next step only when nothing else holds it.
        model = wide()
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002, sufficient_factors=True)
        train_ddp(ddp, model, 3, rank, world)
        kept = model.b.weight.grad
        value = kept.clone()
        train_ddp(ddp, model, 1, rank, world)
        check(torch.equal(kept, value), "a gradient kept across a step changed")
        check(model.b.weight.grad.data_ptr() != kept.data_ptr(), "the kept gradient's memory was reused")
        model = outside_use_model()
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002, sufficient_factors=True)
        train_ddp(ddp, model, 4, rank, world)
        check(ddp.factored == ["b.weight"] and ddp.factor_fallbacks == 3 and ddp.factored_reductions == 0,
              f"{ddp.factored}: {ddp.factored_reductions} factored, {ddp.factor_fallbacks} fallbacks")
        d = maxdiff(model, reference(4, world, make=outside_use_model))
        check(d <= TOL, f"max |ddp, weight used outside its layer - single process| = {d}")
        model = base_model()
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002, sufficient_factors="auto")
        train_ddp(ddp, model, 3, rank, world)
        check(ddp.factored == [], f"auto factored {ddp.factored} on a 4-row batch")
        check(not any(c.endswith("+factors") for c in ddp._tuner.candidates), f"trials {ddp._tuner.candidates}")
        model = base_model()
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002, sufficient_factors=True)
        train_ddp(ddp, model, 3, rank, world)
        check(ddp.factored == [] and ddp.factored_reductions == 0, f"True factored {ddp.factored} on a 4-row batch")
        d = maxdiff(model, reference(3, world))
        check(d <= TOL, f"max |ddp, True on a tiny model - single process| = {d}")

        # The default ("auto") with a layer worth factoring: timed against the dense reduction over the
        # first steps, the same choice on every rank, exact.
        model = wide()
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002)
        ddp._tuner.max_trials = ddp._tuner.trials  # decided within these steps (extension: case_tuned_algorithm)
        steps = 5 + 5 * len(ddp._tuner.candidates)
        train_ddp(ddp, model, steps, rank, world)
        d = maxdiff(model, reference(steps, world, make=wide))
        check(d <= TOL, f"max |ddp, factors tuned - single process| = {d}")
        decision = ddp._tuner.decision
        check(decision is not None and any(c.endswith("+factors") for c in decision.times),
              f"no timed trial of factors: {decision}")
        check(ddp.factored_reductions >= 5, f"{ddp.factored_reductions} factored reductions in the trials")
        check(ddp.factored == (["b.weight"] if decision.choice.endswith("+factors") else []),
              f"choice {decision.choice}, factored {ddp.factored}")
        agree = ringlet.allgather(torch.tensor([ddp._tuner.candidates.index(decision.choice)]))
        check(len(set(agree.tolist())) == 1, f"ranks chose differently: {agree.tolist()}")
        numbers["factors_choice"] = decision.choice

        # sufficient_factors=True keeps every chosen layer factored past the tuner's choice of algorithm
        # (on 3+ ranks it times "auto" against "direct" over the first steps, factors not on trial).
        model = wide()
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002, sufficient_factors=True)
        train_ddp(ddp, model, 20, rank, world)
        check(ddp.factored == ["b.weight"] and ddp.factored_reductions == 19,
              f"after the tuner ({ddp._tuner.decision}): factored {ddp.factored}, {ddp.factored_reductions} reductions")
        d = maxdiff(model, reference(20, world, make=wide))
        check(d <= TOL, f"max |ddp, factors forced through tuning - single process| = {d}")
    return run


def case_unused(rank, world):
    def run(numbers):
        for as_view, factors in ((False, False), (True, False), (False, True)):
            make = (lambda: wide(extra=True)) if factors else (lambda: base_model(extra=True))
            model = make()
            dead0 = model.dead.weight.detach().clone()
            ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002, find_unused_parameters=True,
                                          gradient_as_bucket_view=as_view, sufficient_factors=factors)
            train_ddp(ddp, model, 4, rank, world, momentum=0.0)
            d = maxdiff(model, reference(4, world, momentum=0.0, make=make))
            check(d <= TOL, f"max |ddp - single process| with unused parameters (views: {as_view}, "
                  f"factors: {factors}) = {d}")
            check(not factors or "side.weight" in ddp.factored, f"factored: {ddp.factored}")
            check(model.dead.weight.grad is None, "a parameter unused on every rank got a gradient")
            check(torch.equal(model.dead.weight.detach(), dead0), "an unused parameter changed")
    return run


def case_partial_use(rank, world):
    """``only0`` is used by rank 0 alone: its gradient is rank 0's divided by the world size, also when
    it is averaged from factors (only rank 0 has any)."""
    def run(numbers):
        for factors in (False, True):
            make = (lambda: wide(extra=True)) if factors else (lambda: base_model(extra=True))
            model = make()
            ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002, find_unused_parameters=True,
                                          sufficient_factors=factors)
            if factors:  # the first step reduces densely and picks the layers (by rank 0's rows, so rank 0
                x, y = batch(0, world)  # uses only0 here too); the next one uses factors
                F.mse_loss(ddp(mine(x, rank), 0, use_only0=rank == 0), mine(y, rank)).backward()
                model.zero_grad()
            x, y = batch(1, world)  # odd step: ``side`` unused everywhere too
            F.mse_loss(ddp(mine(x, rank), 1, use_only0=rank == 0), mine(y, rank)).backward()
            check(not factors or "only0.weight" in ddp.factored, f"factored: {ddp.factored}")
            refs = []
            for r in range(world):
                m = make()
                m.load_state_dict(model.state_dict())
                F.mse_loss(m(mine(x, r), 1, use_only0=r == 0), mine(y, r)).backward()
                refs.append(m)
            for name, p in model.named_parameters():
                grads = [dict(m.named_parameters())[name].grad for m in refs]
                if all(g is None for g in grads):
                    check(p.grad is None, f"{name}: unused everywhere but has a gradient (factors: {factors})")
                    continue
                want = sum(g if g is not None else torch.zeros_like(p) for g in grads) / world
                check(p.grad is not None, f"{name}: no gradient (factors: {factors})")
                d = (p.grad - want).abs().max().item()
                check(d <= TOL, f"{name}: gradient off by {d} (factors: {factors})")
    return run


def case_unused_error(rank, world):
    def run(numbers):
        model = base_model(extra=True)
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.0002)
        x, y = batch(0, world)
        try:
            F.mse_loss(ddp(mine(x, rank), 0), mine(y, rank)).backward()
        except RuntimeError as exc:
            msg = str(exc)
            check("find_unused_parameters" in msg and "dead.weight" in msg, f"unclear error: {msg}")
            numbers["unused_error"] = msg[:200]
        else:
            raise AssertionError("an unused parameter without find_unused_parameters did not raise")
        # The library keeps working: the same wrapper on a step where everything but `dead` is used
        # raises again, and a fresh wrapper of a fully used model trains correctly.
        model2 = base_model()
        ddp2 = DistributedDataParallel(model2, bucket_cap_mb=0.0002)
        train_ddp(ddp2, model2, 2, rank, world)
        d = maxdiff(model2, reference(2, world))
        check(d <= TOL, f"after the error: max diff {d}")
    return run


def case_initial_broadcast(rank, world):
    def run(numbers):
        model = base_model()
        want = copy.deepcopy(model.state_dict())
        with torch.no_grad():
            for p in model.parameters():
                p.add_(rank)
            model.bn.running_mean.fill_(float(rank))
        ddp = DistributedDataParallel(model)
        for k, v in model.state_dict().items():
            check(torch.equal(v, want[k]), f"{k} not broadcast from rank 0")
        # broadcast_buffers: rank 0's running stats win before every forward.
        with torch.no_grad():
            model.bn.running_var.fill_(float(rank + 1))
        ddp(torch.ones(2, 6))
        check(torch.equal(model.bn.running_var, torch.ones(4)), f"buffers: {model.bn.running_var}")
        check(ddp.state_dict().keys() == {f"module.{k}" for k in want}, "state_dict keys")
    return run


def stock_ddp(model, pg, hook=None, state=None):
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg, bucket_cap_mb=0.001)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    return ddp


def train_stock(ddp, model, steps, rank, world):
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for s in range(steps):
        opt.zero_grad()
        x, y = batch(s, world)
        F.mse_loss(ddp(mine(x, rank)), mine(y, rank)).backward()
        opt.step()


def case_hooks(rank, world, pg):
    def run(numbers):
        plain = base_model()
        train_stock(stock_ddp(plain, pg), plain, 4, rank, world)
        hooked = base_model()
        train_stock(stock_ddp(hooked, pg, hooks.allreduce_hook, hooks.HookState()), hooked, 4, rank, world)
        d = maxdiff(hooked, plain)
        numbers["hook_vs_stock"] = d
        check(d <= TOL, f"stock DDP + ringlet allreduce_hook vs stock DDP: {d}")
        check(maxdiff(hooked, reference(4, world)) <= TOL, "stock DDP + hook vs single process")
        for name, hook, tol in (("fp16", hooks.fp16_compress_hook, 1e-2), ("bf16", hooks.bf16_compress_hook, 5e-2)):
            m = base_model()
            train_stock(stock_ddp(m, pg, hook, hooks.HookState(algorithm="ring")), m, 4, rank, world)
            d = maxdiff(m, plain)
            numbers[f"{name}_vs_stock"] = d
            check(d <= tol, f"{name} hook off by {d}")
    return run


def case_timeline(rank, world, trace):
    def run(numbers):
        timeline.start_timeline(trace)
        try:
            model = base_model(width=256)
            ddp = DistributedDataParallel(model, bucket_cap_mb=0.05)
            train_ddp(ddp, model, 6, rank, world)
        finally:
            timeline.stop_timeline()
        if rank == 0:
            from ringlet.cli.report import analyze

            events = json.loads(open(trace).read())  # a complete, valid JSON array after stop
            phases = {e["name"] for e in events if e.get("ph") == "X"}
            check({"BACKWARD", "FORWARD", "COMMUNICATE", "QUEUE"} <= phases, f"phases {phases}")
            rep = analyze(trace)
            check(len(rep.steps) == 6, f"{len(rep.steps)} steps in the report")
            for s in rep.steps:
                check(s.compute_us > 0 and s.comm_us > 0, f"step {s}")
                check(0 <= s.hidden_us <= s.comm_us + 1e-6 and 0 <= s.exposed_share <= 1, f"step {s}")
            numbers["report_summary"] = {k: getattr(rep.summary, k) for k in rep.summary.__slots__}
    return run


def case_coordinated(rank, world, pg):
    """ringlet.torch initialised: DDP and the hooks keep ringlet's ordered core queue (their own choice, not
    global state) and train as without it."""
    def run(numbers):
        import ringlet.torch as hvd

        hvd.init()
        ddp_model = base_model()
        ddp = DistributedDataParallel(ddp_model, bucket_cap_mb=0.0002)
        check(not ddp._comm.coordinated, "DDP left the ordered queue under ringlet.torch")
        train_ddp(ddp, ddp_model, 3, rank, world)
        d = maxdiff(ddp_model, reference(3, world))
        check(d <= TOL, f"coordinated DDP vs single process: {d}")
        plain = base_model()
        train_stock(stock_ddp(plain, pg), plain, 3, rank, world)
        hooked = base_model()
        train_stock(stock_ddp(hooked, pg, hooks.allreduce_hook, hooks.HookState()), hooked, 3, rank, world)
        d = maxdiff(hooked, plain)
        check(d <= TOL, f"coordinated hook vs stock DDP: {d}")
    return run


def main() -> int:
    out = sys.argv[1]
    torch.set_num_threads(1)
    ringlet.init()
    rank, world = ringlet.rank(), ringlet.size()
    pg = dist.new_group(backend="gloo")  # stock DDP's own group, apart from the one ringlet's transport uses
    cases = [
        ("equiv_many_buckets", case_equiv(rank, world, 0.0002, lambda n: n > 2)),
        ("equiv_one_bucket", case_equiv(rank, world, 25, lambda n: n == 1)),
        ("equiv_gradient_as_bucket_view", case_grad_view(rank, world)),
        ("lent_gradients", case_lent_gradients(rank, world)),
        ("tuned_algorithm", case_tuned_algorithm(rank, world)),
        ("rebuild_arrival_order", case_rebuild_arrival_order(rank, world)),
        ("accumulation_no_sync", case_accumulation(rank, world)),
        ("sufficient_factors", case_sufficient_factors(rank, world)),
        ("find_unused_parameters", case_unused(rank, world)),
        ("partial_use", case_partial_use(rank, world)),
        ("unused_without_flag_raises", case_unused_error(rank, world)),
        ("initial_broadcast", case_initial_broadcast(rank, world)),
        ("stock_ddp_hooks", case_hooks(rank, world, pg)),
        ("timeline", case_timeline(rank, world, out + ".trace.json")),
        ("coordinated", case_coordinated(rank, world, pg)),
    ]
    run_cases(cases, out, rank, world, sys.argv[2].split(",") if len(sys.argv) > 2 else None)
    try:
        import ringlet.torch as hvd

        hvd.shutdown()
    finally:
        ringlet.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

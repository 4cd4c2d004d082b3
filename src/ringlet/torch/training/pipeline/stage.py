"""One step of one pipeline stage: run its action list (:mod:`.schedules`) over the micro-batches, with
the activations and gradients travelling as :mod:`.schedules` says, and measure where the time went."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import ringlet
from ringlet import timeline
from ringlet.straggler import NullMeter

from .boundary import HEADER_TAG, Header, Pool, act_tag, grad_tag
from .schedules import FORWARD, Action

__all__ = ["StepStats", "StageRunner"]


@dataclass
class StepStats:
    """Where this rank's last :meth:`~.pipeline.Pipeline.step` spent its time (seconds), and the most
    micro-batches whose activations it held at once.

    ``compute_s``: forwards, losses and backwards; ``wait_s``: blocked on the neighbouring stages (their
    activations, gradients, and sends still in flight); ``reduce_s``: after the last backward's
    computation, waiting for the replica average still running; ``step_s``: the whole step. ``bubble``:
    ``wait_s / step_s``, to hold against :func:`~.schedules.bubble_fraction`.

    On the timeline's clock (:func:`ringlet.timeline.now_us`, microseconds, shared by the processes of one
    host): ``compute_end_us``, when the last backward's computation ended; ``allreduce_spans``, the
    ``(start, end)`` of each bucket's replica all-reduce on the communication thread (empty with one
    replica). ``allreduce_s``: the time at least one of them ran. With them a benchmark can tell which
    part of the replica average ran while this stage or another was still computing."""

    stages: int = 0
    microbatches: int = 0
    step_s: float = 0.0
    compute_s: float = 0.0
    wait_s: float = 0.0
    reduce_s: float = 0.0
    peak_inflight: int = 0
    compute_end_us: float = 0.0
    allreduce_spans: tuple[tuple[float, float], ...] = ()

    @property
    def bubble(self) -> float:
        return self.wait_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def allreduce_s(self) -> float:
        return timeline.measure(timeline.union(list(self.allreduce_spans))) * 1e-6


@dataclass
class _Step:
    """The state of the step in progress."""

    xs: list | None
    ys: list | None
    loss_fn: Callable | None
    scaler: Any
    rows: int
    header_in: Header | None = None
    header_out: Header | None = None
    recvs: dict = field(default_factory=dict)      # micro-batch -> (work, buffer) of its input
    inputs: dict = field(default_factory=dict)     # micro-batch -> (input leaf, pooled buffer or None)
    roots: dict = field(default_factory=dict)      # micro-batch -> the tensor its backward starts from
    grad_recvs: dict = field(default_factory=dict)  # micro-batch -> (work, buffer) of its output's gradient
    act_sends: dict = field(default_factory=dict)  # micro-batch -> send of its output
    grad_sent: set = field(default_factory=set)
    sends: list = field(default_factory=list)      # gradient sends and the header, waited at the end
    losses: list = field(default_factory=list)
    held: int = 0
    graph_done: float = 0.0
    graph_done_us: float = 0.0  # graph_done on the timeline's clock


class StageRunner:
    """Runs steps of stage ``stage`` of ``stages``; ``prev``/``next``: the neighbours' global ranks (None
    at the ends). ``forward``: the module to call (the DDP wrapper when there is one); ``no_sync``: its
    context for every forward; ``arm``: called with the root of the last backward, before it runs
    (``DistributedDataParallel.prepare_for_backward``), or None."""

    def __init__(self, stage: int, stages: int, prev: int | None, next_: int | None,
                 forward: Callable, no_sync: Callable[[], Any], arm: Callable | None):
        self.stage, self.stages, self.prev, self.next = stage, stages, prev, next_
        self._forward, self._no_sync, self._arm = forward, no_sync, arm
        self._acts, self._grads = Pool(), Pool()
        self.stats = StepStats(stages)
        self.meter = NullMeter()  # the straggler meter its waits on the neighbouring stages go to

    # ---- a step ----------------------------------------------------------------------------------------
    def run(self, actions: tuple[Action, ...], step: _Step, microbatches: int) -> float | None:
        """Run ``actions``; return the mean loss on the last stage (None elsewhere)."""
        stats = self.stats = StepStats(self.stages, microbatches)
        t0 = time.perf_counter()
        self._st, self._m = step, microbatches
        try:
            if self.prev is not None:
                self._take_header()
                self._post_recv(0)
            last = len(actions) - 1
            for k, a in enumerate(actions):
                if a.op == FORWARD:
                    self._run_forward(a.microbatch)
                else:
                    self._run_backward(a.microbatch, k == last)
            self._waited(lambda: [w.wait() for w in step.sends])
        finally:
            self._st = None
        stats.step_s = time.perf_counter() - t0
        if self.next is None:
            return float(torch.stack(step.losses).mean())
        return None

    def _waited(self, fn: Callable) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            dt = time.perf_counter() - t0
            self.stats.wait_s += dt
            self.meter.add_wait(dt)

    def _take_header(self) -> None:
        st = self._st
        buf = self._waited(lambda: ringlet.irecv(Header.empty(), self.prev, HEADER_TAG).wait())
        st.header_in = h = Header.decode(buf)
        self._acts.reset(h.shape, h.dtype)
        if self.next is None and st.ys is not None and h.rows != st.rows:
            raise ValueError(f"the last stage's targets have {st.rows} rows, but the first stage's batch has "
                             f"{h.rows}: x and y of a step must have the same batch size.")
        st.rows = h.rows

    def _post_recv(self, i: int) -> None:
        if i < self._m and i not in self._st.recvs:
            buf = self._acts.take()
            self._st.recvs[i] = (ringlet.irecv(buf, self.prev, act_tag(i)), buf)

    # ---- forward -----------------------------------------------------------------------------------------
    def _input(self, i: int) -> torch.Tensor:
        st = self._st
        if self.prev is None:
            st.inputs[i] = (st.xs[i], None)
            return st.xs[i]
        self._post_recv(i)  # posted one forward ahead in the schedules' micro-batch order
        work, buf = st.recvs.pop(i)
        self._waited(work.wait)
        self._post_recv(i + 1)  # the next input travels while this one computes
        inp = buf.detach()
        if st.header_in.needs_grad:
            inp.requires_grad_(True)
            inp.register_hook(lambda g, i=i: self._send_grad(i, g))
        st.inputs[i] = (inp, buf)
        return inp

    def _run_forward(self, i: int) -> None:
        st = self._st
        inp = self._input(i)
        t0 = time.perf_counter()
        with self._no_sync():
            out = self._forward(inp)
        if self.next is None:
            loss = st.loss_fn(out, st.ys[i])
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                raise ValueError(f"loss_fn must return a scalar tensor (the micro-batch's mean loss), got "
                                 f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__}.")
            st.losses.append(loss.detach().float())
            root = loss / self._m
            st.roots[i] = st.scaler.scale(root) if st.scaler is not None else root
        else:
            st.roots[i] = out
        self.stats.compute_s += time.perf_counter() - t0
        if self.next is not None:
            self._send_output(i, out)
        st.held += 1
        self.stats.peak_inflight = max(self.stats.peak_inflight, st.held)

    def _send_output(self, i: int, out: torch.Tensor) -> None:
        """The fused send-forward / receive-backward: the gradient's receive first, then the activation."""
        st = self._st
        if st.header_out is None:
            st.header_out = Header.of(out, st.rows)
            self._grads.reset(st.header_out.shape, st.header_out.dtype)
            st.sends.append(ringlet.isend(st.header_out.encode(), self.next, HEADER_TAG))
        st.header_out.check(out, self.stage, i)
        if st.header_out.needs_grad:
            g = self._grads.take()
            st.grad_recvs[i] = (ringlet.irecv(g, self.next, grad_tag(i)), g)
        st.act_sends[i] = ringlet.isend(out.detach().contiguous(), self.next, act_tag(i))

    # ---- backward ----------------------------------------------------------------------------------------
    def _run_backward(self, i: int, last: bool) -> None:
        st = self._st
        root, grad = st.roots.pop(i), None
        if self.next is not None:
            self._waited(st.act_sends.pop(i).wait)
            if i in st.grad_recvs:
                work, grad = st.grad_recvs.pop(i)
                self._waited(work.wait)
        t0 = time.perf_counter()
        st.graph_done = 0.0
        if root.requires_grad and (grad is not None or self.next is None):
            if last and self._arm is not None:
                self._arm(root)
            root.register_hook(self._mark_graph_end)
            torch.autograd.backward(root, grad)
        t1 = time.perf_counter()
        if last:
            self.stats.compute_end_us = st.graph_done_us if st.graph_done else timeline.now_us()
        reduce = t1 - st.graph_done if last and st.graph_done else 0.0
        self.stats.reduce_s += reduce
        self.stats.compute_s += t1 - t0 - reduce
        self._release(i, grad)

    def _mark_graph_end(self, g: torch.Tensor) -> None:
        """At the root's gradient: queue the callback that notes when the graph's computation is done (it
        runs before the callbacks queued later, such as DDP's wait for the replica average)."""
        def done() -> None:
            self._st.graph_done = time.perf_counter()
            self._st.graph_done_us = timeline.now_us()

        torch.autograd.Variable._execution_engine.queue_callback(done)

    def _release(self, i: int, grad: torch.Tensor | None) -> None:
        st = self._st
        inp, buf = st.inputs.pop(i)
        if self.prev is not None and st.header_in.needs_grad and i not in st.grad_sent:
            self._send_grad(i, torch.zeros_like(inp))  # the input did not reach the output
        if buf is not None:
            self._acts.give(buf)
        if grad is not None:
            self._grads.give(grad)
        st.held -= 1

    def _send_grad(self, i: int, g: torch.Tensor) -> None:
        st = self._st
        st.grad_sent.add(i)
        st.sends = _unfinished(st.sends)  # the gradients already received need not be kept
        st.sends.append(ringlet.isend(g.detach().contiguous(), self.prev, grad_tag(i)))


def _unfinished(sends: list) -> list:
    """The sends of ``sends`` still in flight; a finished one that failed raises its error."""
    keep = []
    for w in sends:
        if w.done():
            w.wait()
        else:
            keep.append(w)
    return keep

"""One reduced backward under priority scheduling: which piece each job on the communication thread
sends, agreed by every rank without a coordinator.

Protocol. Each time a piece becomes ready (its gradients are all in the bucket), the main thread marks it
ready and submits one *slot* job to ringlet's core queue; so every rank submits exactly one slot per piece,
``n`` per backward, at the same places in its sequence of submissions (the gradient hooks run in the order
autograd executes the graph, which is the same on every rank: the assumption first-in-first-out launches
rely on too). A slot does not know in advance which piece it sends: that is decided by agreed data.

* A dense piece that ends where a parameter ends travels with a *control vector* of ``2n`` numbers
  right behind it, in a gap of the bucket's buffer (:mod:`~ringlet.torch.training.pieces`; one all-reduce,
  op AVG, nothing copied): per piece, ``1`` if it is ready and not yet chosen on this rank, else ``0``, and
  its complement. After the all-reduce piece ``k``'s first entry is positive exactly when some rank had
  it ready, and its second entry is zero exactly when every rank had it ready (a sum of zeros is exactly
  zero and a sum of non-negative numbers with one positive is positive, in every floating dtype).
* From that vector every rank computes the *queue* of the next slots with :func:`choose_order`: the
  pieces ready everywhere, highest priority first, up to ``partition_bytes`` of gradient (the credit:
  at least one piece); else the lowest-numbered piece ready somewhere (the one the slower ranks will
  produce first); else nothing. Each dense piece sent replaces the queue by a fresh one (so a front
  piece that became ready overtakes it); a whole piece (a compressed bucket, a weight averaged from
  factors) or a piece inside a parameter, which carry no vector, leave the rest of the queue in place.
* A slot that finds the queue empty (the first of a backward, one after a vector that showed nothing
  ready) first runs an *agreement*: the control vector alone, all-reduced.

Why ranks send the same piece in every slot: the queue is a function of reduced vectors (the same on
every rank) and of the pieces already chosen (the same on every rank, by induction). Why no slot waits
forever: slot ``j`` (counting from 1) is submitted when ``j`` pieces are ready on that rank and runs
after ``j - 1`` were chosen, so at its agreement every rank has a ready piece not yet chosen and the
vector is not empty; and a queued piece was ready on some rank ``r`` while ``r`` had completed only the
core queue's jobs before the slot that took the vector — so ``r`` produced it waiting on nothing later
in the core queue, and every other rank, running the same program, produces it too without waiting on
the slot that blocks for it.
A rank whose piece is not ready yet waits for it on the communication thread, with ringlet's collective
timeout. Every slot sends one piece not chosen before, so the ``n`` slots send every piece once.

Only the comm thread touches the chosen/next state; the ready flags are shared under a condition.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

import torch

from ringlet import timeline
from ringlet.types import CollectiveTimeout, ReduceOp

if TYPE_CHECKING:
    from ..comm import Comm
    from .pieces import Piece, PieceLayout

__all__ = ["Round", "choose_order", "TRACK"]

TRACK = "ddp.priority"  # timeline track of the agreements


def choose_order(some: list[bool], every: list[bool], chosen: list[bool], nbytes: list[int],
                 credit: int) -> list[int]:
    """The pieces the next slots send, in order: those not ``chosen`` that are ready on every rank,
    highest-numbered first, as many as fit in ``credit`` bytes (``nbytes`` per piece; at least one); if
    there is none, the lowest-numbered one not chosen that is ready on some rank; else none."""
    order, total = [], 0
    for k in reversed(range(len(chosen))):
        if every[k] and not chosen[k]:
            if order and total + nbytes[k] > credit:
                break
            order.append(k)
            total += nbytes[k]
    if order:
        return order
    return next(([k] for k in range(len(chosen)) if some[k] and not chosen[k]), [])


class Round:
    """The pieces of one reduced backward in flight (see the module doc). ``algo``: the all-reduce
    algorithm of this step; ``credit``: the bytes of gradient a queue may hold."""

    def __init__(self, layout: PieceLayout, comm: Comm, algo: str, timeout: float, credit: int,
                 observe: Callable[[str, int, tuple[float, float] | None], None] | None = None):
        n = len(layout.pieces)
        self._observe = observe  # told of every dense piece sent (ReductionContext.observe)
        self.layout = layout
        self.algo = algo
        self._credit = credit
        self._nbytes = [q.nbytes for q in layout.pieces]
        self._comm, self._timeout = comm, timeout
        self._cond = threading.Condition()
        self._ready = [False] * n            # this rank (shared: main thread writes)
        self._t_ready = [0.0] * n
        self._jobs: list[Callable[[], Any] | None] = [None] * n  # whole pieces: their staged send
        self._chosen = [False] * n           # agreed (comm thread)
        self._queue: list[int] = []          # agreed (comm thread)
        self._error: BaseException | None = None
        self.futures = [torch.futures.Future() for _ in range(n)]
        self.order: list[int] = []           # pieces in the order the slots chose them (for reports, tests)

    # ---- main thread ---------------------------------------------------------------------------------
    def mark_ready(self, ready: list[tuple[int, Callable[[], Any] | None]]) -> None:
        """The pieces ``i`` of ``ready`` are ready on this rank, all at once (``job``: a whole piece's
        send, else None); submits one slot per piece."""
        now = timeline.now_us()
        with self._cond:
            for i, job in ready:
                self._ready[i] = True
                self._t_ready[i] = now
                self._jobs[i] = job
            self._cond.notify_all()
        for _ in ready:
            self._comm.submit(self._slot)

    def wait(self, i: int) -> Any:
        """Piece ``i``'s result once sent (None for a dense piece); raises the error that stopped the round."""
        return self.futures[i].wait()

    # ---- communication thread ------------------------------------------------------------------------
    def _slot(self) -> None:
        if self._error is not None:
            return
        try:
            if not self._queue:
                self._queue = self._agree()
            i = self._queue.pop(0)
            self._chosen[i] = True
            self.order.append(i)
            self._await_ready(i)
            result = self._send(self.layout.pieces[i])
        except BaseException as exc:  # noqa: BLE001 - every waiter of this round must hear of it
            self._fail(exc)
            return
        self.futures[i].set_result(result)

    def _control(self, dtype: torch.dtype, out: torch.Tensor) -> None:
        """This rank's control vector into ``out`` (2n numbers, see the module doc)."""
        with self._cond:
            flags = [r and not c for r, c in zip(self._ready, self._chosen)]
        n = len(flags)
        mine = torch.tensor(flags, dtype=dtype)
        out[:n].copy_(mine)
        out[n:].copy_(1 - mine)

    def _decide(self, control: torch.Tensor) -> list[int]:
        n = len(self._chosen)
        some = (control[:n] > 0).tolist()
        every = (control[n:] == 0).tolist()
        return choose_order(some, every, self._chosen, self._nbytes, self._credit)

    def _agree(self) -> list[int]:
        t0 = timeline.now_us()
        layout = self.layout
        control = torch.empty(2 * len(layout.pieces), dtype=torch.float32)
        self._control(torch.float32, control)
        self._comm.allreduce_(control, ReduceOp.AVG, "ddp.priority.agree", check=None if not layout.checked
                              else False, algorithm="auto").wait()
        layout.checked = True
        order = self._decide(control)
        if not order:  # impossible unless the ranks disagree on the layout or the slot count
            raise RuntimeError("DistributedDataParallel priority scheduling: no piece is ready on any rank at "
                               "an agreement (the ranks' bucket layouts or gradient hooks differ).")
        timeline.span(TRACK, "NEGOTIATE", t0, timeline.now_us(), {"pieces": order})
        return order

    def _await_ready(self, i: int) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._ready[i], timeout=self._timeout):
                raise CollectiveTimeout(f"DistributedDataParallel priority scheduling: piece {i} (bucket "
                                        f"{self.layout.pieces[i].bucket.index}) was chosen but its gradients "
                                        f"did not arrive on this rank within {self._timeout:.0f} s.")

    def _send(self, q: Piece) -> Any:
        """Send piece ``q`` (a dense range, with the control vector behind it if it carries one; a whole
        piece as its bucket's reduction sends it); returns a whole piece's result."""
        t0 = timeline.now_us()
        b = q.bucket
        if q.whole:
            result = self._jobs[q.index]()
        else:
            result = None
            self._send_dense(q)
        t1 = timeline.now_us()
        args = {"piece": q.index, "bytes": q.nbytes, "params": len(q.slots)}
        timeline.span(f"ddp.bucket{b.index}", "QUEUE", self._t_ready[q.index], t0)
        timeline.span(f"ddp.bucket{b.index}", "COMMUNICATE", t0, t1, args)
        return result

    def _send_dense(self, q: Piece) -> None:
        """All-reduce the piece (and its control vector); a fresh vector replaces the queue."""
        b = q.bucket
        n2 = 2 * len(self.layout.pieces) if q.carries else 0
        view = b.buffer[q.lo:q.hi + n2]
        if n2:
            self._control(b.buffer.dtype, view[q.hi - q.lo:])
        check = None if self.algo not in q.validated else False
        fut = self._comm.allreduce_(view, ReduceOp.AVG, f"ddp.bucket{b.index}.piece{q.index}", check=check,
                                    algorithm=self.algo)
        fut.wait()
        if self._observe is not None:
            self._observe(self.algo, view.numel() * view.element_size(), fut.span())
        q.validated.add(self.algo)
        if n2:
            self._queue = self._decide(view[q.hi - q.lo:])

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        for f in self.futures:
            if not f.done():
                f.set_exception(exc)

"""A checker of compiled plans: every rank's plan of one schedule, run together, neither deadlocks nor
races under any message timing a transport may produce.

The model. Each rank runs its plan's actions in order (:mod:`ringlet.algorithms.executor`). A posted
receive's data may land at any moment after both it and the matching send are posted, until the
receive is waited for (its ``APPLY``). A send reads its range from its post until it is waited for, or
until the receiver has waited for the data (whichever comes first). A non-direct ``APPLY`` reads the
scratch and writes the buffer at once. Messages match first-posted to first-posted per (sender,
receiver, step), as the transports' FIFO matching does.

*Happens-before* is program order on each rank plus, for each message, "the send is posted" before
"the receive's wait returns" — nothing else, so an eager transport (whose sends complete at once) is
covered. Two accesses of one rank to overlapping elements of a buffer or of the scratch, one of them a
write, *race* unless one provably ends before the other begins.

*Deadlock* is checked under the strictest transport: a send's wait returns only once the matching
receive is posted (rendezvous); a plan that completes under it completes under any eager one too.

``check_plans`` returns a list of problems in words (empty: sound). It is a test tool (used on every
all-reduce in ``tests/unit/test_plan_check.py``); new schedules and executor rules are checked with it.
"""
from __future__ import annotations

import dataclasses

from .executor import APPLY, Plan, compile_plan
from .schedule import Schedule

SCRATCH = -1  # the "buffer" index of a rank's scratch


@dataclasses.dataclass(frozen=True)
class _Access:
    space: int  # buffer index, or SCRATCH
    lo: int
    hi: int
    write: bool
    starts: tuple  # nodes (rank, index): the access begins after all of them
    ends: tuple  # nodes: the access is over once any of them has happened
    what: str


class _Run:
    """Every rank's plan, the message matching, and the vector clocks of every action."""

    def __init__(self, plans: list[Plan]):
        self.plans = plans
        self.p = len(plans)
        self.problems: list[str] = []
        self.waited = [dict() for _ in plans]  # rank -> {send id: node that waits for it}
        self.posted = [dict() for _ in plans]  # rank -> {message id: node that posts it}
        self.applied = [dict() for _ in plans]  # rank -> {receive id: its APPLY node}
        for r, plan in enumerate(plans):
            for i, act in enumerate(plan.actions):
                kind, mid, waits = act
                (self.applied if kind == APPLY else self.posted)[r].setdefault(mid, i)
                for sid in waits:
                    self._wait(r, sid, i)
            for sid in plan.tail_waits:
                self._wait(r, sid, len(plan.actions))
        self.match: dict[tuple[int, int], tuple[int, int]] = {}  # (rank, message id) -> (peer rank, its id)
        self._match()

    def _wait(self, r: int, sid: int, node: int) -> None:
        if sid in self.waited[r]:
            self.problems.append(f"rank {r}: send {sid} is waited for twice")
        self.waited[r][sid] = node

    def _match(self) -> None:
        queues: dict[tuple, list] = {}
        for r, plan in enumerate(self.plans):
            for i, (kind, mid, _) in enumerate(plan.actions):
                if kind == APPLY:
                    continue
                m = plan.msgs[mid]
                key = (r, m.peer, m.step) if m.is_send else (m.peer, r, m.step)
                queues.setdefault(key, [[], []])[0 if m.is_send else 1].append((r, mid))
        for (src, dst, step), (sends, recvs) in queues.items():
            if len(sends) != len(recvs):
                self.problems.append(f"step {step}: rank {src} posts {len(sends)} sends to rank {dst}, "
                                     f"which posts {len(recvs)} receives")
            for a, b in zip(sends, recvs):
                ca, cb = self.plans[a[0]].msgs[a[1]].count, self.plans[b[0]].msgs[b[1]].count
                if ca != cb:
                    self.problems.append(f"step {step}: rank {src} sends {ca} elements, rank {dst} receives {cb}")
                self.match[a], self.match[b] = b, a
        for r, plan in enumerate(self.plans):
            for mid, m in enumerate(plan.msgs):
                if (r, mid) not in self.match:
                    self.problems.append(f"rank {r}: message {mid} is never matched")
                elif m.is_send and mid not in self.waited[r]:
                    self.problems.append(f"rank {r}: send {mid} is never waited for")
                elif not m.is_send and mid not in self.applied[r]:
                    self.problems.append(f"rank {r}: receive {mid} is never waited for")

    def _blocked(self, r: int, i: int, done: list[int]) -> tuple | None:
        """The node (rank, index) action ``i`` of rank ``r`` waits for that has not run, or None."""
        plan = self.plans[r]
        waits = plan.tail_waits if i == len(plan.actions) else plan.actions[i][2]
        for sid in waits:  # rendezvous: a send completes once its receive is posted
            q, rid = self.match[(r, sid)]
            if self.posted[q][rid] >= done[q]:
                return q, self.posted[q][rid]
        if i < len(plan.actions) and plan.actions[i][0] == APPLY:
            q, sid = self.match[(r, plan.actions[i][1])]
            if self.posted[q][sid] >= done[q]:
                return q, self.posted[q][sid]
        return None

    def clocks(self) -> list[list[list[int]]] | None:
        """Vector clocks of every node (the tail is node ``len(actions)``), or None on a deadlock."""
        p = self.p
        vc: list[list[list[int]]] = [[] for _ in range(p)]
        done = [0] * p
        total = [len(plan.actions) + 1 for plan in self.plans]
        while done != total:
            moved = False
            for r in range(p):
                while done[r] < total[r] and self._blocked(r, done[r], done) is None:
                    self._tick(r, done[r], vc)
                    done[r] += 1
                    moved = True
            if not moved:
                stuck = {r: self._blocked(r, done[r], done) for r in range(p) if done[r] < total[r]}
                self.problems.append(f"deadlock: rank -> (rank, action) it waits for: {stuck}")
                return None
        return vc

    def _tick(self, r: int, i: int, vc) -> None:
        clock = list(vc[r][i - 1]) if i else [-1] * self.p
        plan = self.plans[r]
        if i < len(plan.actions) and plan.actions[i][0] == APPLY:
            q, sid = self.match[(r, plan.actions[i][1])]
            clock = [max(a, b) for a, b in zip(clock, vc[q][self.posted[q][sid]])]
        clock[r] = i
        vc[r].append(clock)

    def accesses(self, r: int) -> list[_Access]:
        plan, out = self.plans[r], []
        for mid, m in enumerate(plan.msgs):
            q, other = self.match[(r, mid)]
            if m.is_send:
                ends = ((r, self.waited[r][mid]), (q, self.applied[q][other]))
                out.append(_Access(m.buf, m.offset, m.offset + m.count, False, ((r, self.posted[r][mid]),), ends,
                                   f"send {mid} (step {m.step}) to rank {m.peer}"))
                continue
            starts = ((r, self.posted[r][mid]), (q, self.posted[q][other]))
            ends = ((r, self.applied[r][mid]),)
            space, lo = (m.buf, m.offset) if m.direct else (SCRATCH, m.scratch)
            out.append(_Access(space, lo, lo + m.count, True, starts, ends,
                               f"receive {mid} (step {m.step}) from rank {m.peer}"))
            if not m.direct:
                at = ((r, self.applied[r][mid]),)
                out.append(_Access(SCRATCH, m.scratch, m.scratch + m.count, False, at, at, f"apply {mid}"))
                out.append(_Access(m.buf, m.offset, m.offset + m.count, True, at, at, f"apply {mid}"))
        return out


def _before(vc, a: _Access, b: _Access) -> bool:
    """True when ``a`` is over before ``b`` begins: one of a's ends happens before one of b's starts."""
    return any(e == s or vc[s[0]][s[1]][e[0]] >= e[1] for e in a.ends for s in b.starts)


def races(run: _Run, vc) -> list[str]:
    out = []
    for r in range(run.p):
        acc = sorted(run.accesses(r), key=lambda a: (a.space, a.lo))
        for i, a in enumerate(acc):
            for b in acc[i + 1:]:
                if b.space != a.space or b.lo >= a.hi:
                    break
                if a.lo == a.hi or b.lo == b.hi or not (a.write or b.write):
                    continue
                if not (_before(vc, a, b) or _before(vc, b, a)):
                    where = "scratch" if a.space == SCRATCH else f"buffer {a.space}"
                    out.append(f"rank {r}: {a.what} and {b.what} may overlap in time on {where} "
                               f"[{max(a.lo, b.lo)}, {min(a.hi, b.hi)})")
    return out


def check_plans(schedule: Schedule, segment: int, *, hold: bool = True, interleave: bool = True,
                limit: int = 20) -> list[str]:
    """Problems of ``schedule``'s plans compiled with ``segment`` elements per message and the executor's
    rules as given (:func:`ringlet.algorithms.executor.compile_plan`), at most ``limit`` of them."""
    run = _Run([compile_plan(schedule, r, segment, hold, interleave) for r in range(schedule.nranks)])
    if run.problems:
        return run.problems[:limit]
    vc = run.clocks()
    if vc is None:
        return run.problems[:limit]
    return races(run, vc)[:limit]

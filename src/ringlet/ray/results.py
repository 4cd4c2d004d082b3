"""Collecting the workers' results, and the one error :meth:`RayExecutor.run` raises when some fail.

While every worker runs, the driver waits as long as they take. Once one fails, the failure is made
known to the others (a death record in the job's store, which their liveness monitors turn into a
``PeerError`` naming the rank within a heartbeat), and they get ``timeout_s`` more seconds to stop.
"""
from __future__ import annotations

import time

from ..types import PeerError

POLL_S = 1.0  # seconds between looks at the workers while none has failed


def unwrap(ray, exc: BaseException) -> BaseException:
    """The exception a worker's function raised (Ray wraps it in a ``RayTaskError``); a dead actor's
    ``RayActorError`` stays as it is."""
    if isinstance(exc, ray.exceptions.RayTaskError) and getattr(exc, "cause", None) is not None:
        return exc.cause
    return exc


class Gather:
    """Wait for ``refs`` (one per rank, in rank order). ``hosts[r]``: rank r's host, for messages.
    ``on_failure(rank, host, reason)`` is called once for a failure that is not itself a ``PeerError``
    while other ranks still run (it tells them)."""

    def __init__(self, ray, refs, hosts: list[str], timeout_s: float, on_failure):
        self.ray, self.hosts, self.timeout_s, self.on_failure = ray, hosts, timeout_s, on_failure
        self.pending = {ref: rank for rank, ref in enumerate(refs)}
        self.results: dict[int, object] = {}
        self.errors: list[tuple[int, BaseException]] = []  # in the order they arrived
        self.failed_at: float | None = None

    def wait(self) -> list:
        """The results in rank order; the chosen error (:meth:`error`) when any rank failed."""
        while self.pending:
            left = POLL_S if self.failed_at is None else self.failed_at + self.timeout_s - time.monotonic()
            if left <= 0:
                break
            ready, _ = self.ray.wait(list(self.pending), num_returns=1, timeout=min(left, POLL_S))
            for ref in ready:
                self._take(ref, self.pending.pop(ref))
        if self.errors:
            raise self.error()
        return [self.results[r] for r in range(len(self.results))]

    def _take(self, ref, rank: int) -> None:
        try:
            self.results[rank] = self.ray.get(ref)
            return
        except Exception as exc:  # noqa: BLE001 - every worker's failure is sorted out below
            err = unwrap(self.ray, exc)
        self.errors.append((rank, err))
        if self.failed_at is None:
            self.failed_at = time.monotonic()
        if self.pending and not isinstance(err, PeerError):
            try:
                self.on_failure(rank, self.hosts[rank], self._reason(err))
            except Exception:  # noqa: BLE001 - the others still stop on their own (heartbeat silence)
                pass

    def _reason(self, err: BaseException) -> str:
        if isinstance(err, self.ray.exceptions.RayActorError):
            return f"died (its Ray actor: {_first_line(err)})"
        return f"raised {type(err).__name__}: {_first_line(err)}"

    def error(self) -> BaseException:
        """What went wrong first: the exception a rank's function raised; else, when a worker died, the
        survivors' ``PeerError`` naming it (or one made here when no survivor said)."""
        actor_error = self.ray.exceptions.RayActorError
        own = [(r, e) for r, e in self.errors if not isinstance(e, (PeerError, actor_error))]
        peer = [(r, e) for r, e in self.errors if isinstance(e, PeerError)]
        dead = [(r, e) for r, e in self.errors if isinstance(e, actor_error)]
        if own:
            rank, err = own[0]
            err.add_note(f"(raised by rank {rank} of the RayExecutor's job, host {self.hosts[rank]})")
        elif dead and not any(e.rank is not None for _, e in peer):
            rank, cause = dead[0]
            err = PeerError(f"rank {rank} (host {self.hosts[rank]}) died: its Ray actor ended "
                            f"({_first_line(cause)})", rank=rank, host=self.hosts[rank])
            err.__cause__ = cause
        else:
            named = [(r, e) for r, e in peer if e.rank is not None]
            rank, err = (named or peer)[0]
        if self.pending:
            still = sorted(self.pending.values())
            err.add_note(f"ranks {still} had not stopped {self.timeout_s:g} s after the first failure")
        return err


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

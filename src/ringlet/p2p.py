"""Point-to-point: ``isend``/``irecv`` of one tensor between two ranks, beside the collectives.

Unlike the collectives these are not queued on the communication thread: they are posted on the
transport at once, from the caller's thread, so a send or receive never waits behind a collective still
running (a pipeline stage sends an activation gradient while its gradient all-reduce is in flight).
Their messages carry a tag slot of their own (:data:`ringlet.engine.channel.P2P_SLOT`), so they never
meet a collective's.

Contract, as ``torch.distributed.isend``/``irecv``:

* ``tensor``: a dense contiguous tensor of a supported dtype; a receive fills it in place, and the
  message must have exactly its number of bytes (shared memory fails the receive on a mismatch; MPI
  fills the front of a larger buffer silently: agree on sizes first, e.g. with a small header).
* ``dst``/``src``: a global rank, member of ``group`` (default: the world), not the caller's own.
* ``tag``: an int in ``[0, P2P_TAGS)`` (0 .. 2**24 - 1). Messages between one (source, destination, tag)
  are matched in the order they were posted; the group only names the ranks (two groups over the same
  pair share the tags).
* The returned :class:`P2PWork` completes on the thread that waits for it (``wait()`` or ``done()``);
  ``wait()`` without a timeout fails after ``Options.timeout`` seconds with
  :class:`~ringlet.types.CollectiveTimeout` naming the peer and the tag; a failed or silent peer raises
  :class:`~ringlet.types.PeerError` (named by the liveness monitor when it knows).
* The transport must allow posts from several threads (``capabilities.threaded_posts``); otherwise
  ``RuntimeError`` at the call.

Bad arguments raise ``ValueError`` at the call, before anything is posted.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch

from .collectives import _group, runtime
from .engine import args
from .engine.channel import P2P_TAGS, p2p_tag
from .group import Group
from .runtime import Runtime, Work
from .types import CollectiveTimeout, PeerError, RingletError

__all__ = ["isend", "irecv", "send", "recv", "P2PWork", "P2P_TAGS"]


class P2PWork(Work):
    """The handle of one send or receive. The transport's handle is driven by whoever waits: ``done()``
    polls it, ``wait()`` blocks on it (within ``Options.timeout``), ``wait(timeout)`` polls until
    ``timeout`` and raises ``TimeoutError`` while the message is still on its way (the operation goes on,
    as for a collective's :class:`~ringlet.runtime.Work`). Callbacks run on the thread that sees the
    completion. The result of a receive is its tensor; of a send, None."""

    __slots__ = ("_handle", "_what", "_limit", "_explain", "_drive", "_keep")

    def __init__(self, handle, what: str, limit: float | None, explain: Callable[[PeerError], BaseException],
                 keep: torch.Tensor, result: Any) -> None:
        super().__init__()
        self._handle, self._what, self._limit, self._explain = handle, what, limit, explain
        self._drive = threading.Lock()  # one thread at a time drives the transport's handle
        self._keep = keep  # the buffer stays alive while the transport may touch it
        self._result = result

    def done(self) -> bool:
        if not self._done and self._drive.acquire(blocking=False):
            try:
                if not self._done and self._handle.done():
                    self._handle.wait(self._limit)  # a failed operation is done too: its wait raises
                    self._settle()
            except RingletError as exc:
                self._fail(exc)
            finally:
                self._drive.release()
        return self._done

    def wait(self, timeout: float | None = None) -> Any:
        if timeout is not None:
            self._poll_until(time.monotonic() + timeout)
        elif not self._done:
            with self._drive:
                if not self._done:
                    try:
                        self._handle.wait(self._limit)
                        self._settle()
                    except RingletError as exc:
                        self._fail(exc)
        return super().wait()

    def _poll_until(self, deadline: float) -> None:
        pause = 1e-5
        while not self.done():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self._what} still running")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def _settle(self) -> None:
        self._handle = self._keep = None
        self._finish(self._result)

    def _fail(self, exc: RingletError) -> None:
        """Finish with the transport's error: a peer failure as the runtime names it (the liveness monitor's
        verdict when it has one), a timeout with this operation's description (peer and caller's tag)."""
        if isinstance(exc, PeerError):
            error = self._explain(exc)
        elif isinstance(exc, CollectiveTimeout):
            error = CollectiveTimeout(f"{self._what} timed out after {self._limit}s: {exc}")
            error.__cause__ = exc
        else:
            error = exc
        self._handle = self._keep = None
        self._finish(None, error)


def _peer(rt: Runtime, g: Group, peer, role: str) -> int:
    if not isinstance(peer, int) or isinstance(peer, bool):
        raise ValueError(f"{role} must be an int (a global rank), got {peer!r}.")
    if peer not in g:
        raise ValueError(f"{role} rank {peer} is not a member of group {g.id} (ranks {list(g.ranks)}).")
    if peer == rt.rank:
        raise ValueError(f"{role} rank {peer} is this rank: point-to-point needs another rank.")
    return peer


def _check_tag(tag) -> int:
    if not isinstance(tag, int) or isinstance(tag, bool) or not 0 <= tag < P2P_TAGS:
        raise ValueError(f"tag must be an int in [0, {P2P_TAGS}), got {tag!r}.")
    return tag


def _post(tensor: torch.Tensor, peer, tag, group, role: str) -> P2PWork:
    rt = runtime()
    args.check_tensor(tensor)
    g = _group(rt, group)
    peer = _peer(rt, g, peer, role)
    tag = _check_tag(tag)
    tr = rt.transport
    if not tr.capabilities.threaded_posts:
        raise RuntimeError(f"the {tr.name} transport does not allow posts from several threads at once "
                           "(capabilities.threaded_posts is False; an MPI library without MPI_THREAD_MULTIPLE), "
                           "so ringlet's point-to-point cannot run beside its collectives there.")
    flat = tensor.reshape(-1)  # a view: the tensor is contiguous
    if role == "dst":
        handle, what, result = tr.isend(flat, peer, p2p_tag(tag)), f"rank {rt.rank}: send to rank {peer}", None
    else:
        handle, what, result = tr.irecv(flat, peer, p2p_tag(tag)), f"rank {rt.rank}: receive from rank {peer}", tensor
    return P2PWork(handle, f"{what} (tag {tag})", rt.options.timeout, rt._name_failure, flat, result)


def isend(tensor: torch.Tensor, dst: int, tag: int = 0, group: Group | None = None) -> P2PWork:
    """Post a send of ``tensor`` to global rank ``dst``; ``wait()`` returns None once the transport is done
    with the tensor (do not change it before). See the module doc for the contract."""
    return _post(tensor, dst, tag, group, "dst")


def irecv(tensor: torch.Tensor, src: int, tag: int = 0, group: Group | None = None) -> P2PWork:
    """Post a receive into ``tensor`` from global rank ``src``; ``wait()`` returns ``tensor`` once filled."""
    return _post(tensor, src, tag, group, "src")


def send(tensor: torch.Tensor, dst: int, tag: int = 0, group: Group | None = None) -> None:
    """Blocking :func:`isend`."""
    isend(tensor, dst, tag, group).wait()


def recv(tensor: torch.Tensor, src: int, tag: int = 0, group: Group | None = None) -> torch.Tensor:
    """Blocking :func:`irecv`; returns ``tensor``."""
    return irecv(tensor, src, tag, group).wait()

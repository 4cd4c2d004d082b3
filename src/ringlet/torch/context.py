"""Where the current ``ringlet.torch`` context lives, and the control requests made through it.

A leaf below :mod:`.basics` (which builds and drops contexts), :mod:`.process_sets` and
:mod:`.mpi_ops` (which use the current one). There is one context per process; in-process unit tests
that run ranks as threads under ``ringlet.use_runtime`` get one per thread (:func:`install` with
``thread_local=True``). The context object itself is :class:`ringlet.torch.basics.Context`.
"""
from __future__ import annotations

import threading
from typing import Sequence

from . import requests as rq
from .requests import Meta, Request

_global = None
_local = threading.local()
lock = threading.Lock()  # held by basics.init/shutdown while they install or drop a context


def current():
    """The context of this thread (thread-local first, then the process's), or None before init."""
    ctx = getattr(_local, "ctx", None)
    return ctx if ctx is not None else _global


def context():
    """The current context; ``ValueError`` (Horovod's wording) before ``hvd.init()``."""
    ctx = current()
    if ctx is None:
        raise ValueError("ringlet.torch has not been initialized; use hvd.init().")
    return ctx


def install(ctx, *, thread_local: bool) -> None:
    """Make ``ctx`` current for this thread (``thread_local``) or for the whole process."""
    global _global
    if thread_local:
        _local.ctx = ctx
    else:
        _global = ctx


def uninstall():
    """Drop this thread's context if it has one, else the process's; return the dropped one (or None)."""
    global _global
    ctx = getattr(_local, "ctx", None)
    if ctx is not None:
        _local.ctx = None
        return ctx
    ctx, _global = _global, None
    return ctx


def submit(reqs: list[Request], handle: int) -> int:
    """Hand ``reqs`` to the coordinator under ``handle``; the handle is released if that fails."""
    ctx = context()
    try:
        ctx.coordinator.submit(reqs)
    except BaseException:
        ctx.handles.discard(handle)
        raise
    return handle


_CONTROL_CODES = {"join": rq.JOIN, "barrier": rq.BARRIER, "add_process_set": rq.ADD_PS,
                  "remove_process_set": rq.REMOVE_PS}


def control(kind: str, args: Sequence[int], name: str | None = None, ps_id: int = 0):
    """Run the control request ``kind`` (barrier, add/remove_process_set) on every rank; wait and return
    its result. (``join`` carries its own arguments: see :func:`ringlet.torch.mpi_ops.join`.)"""
    ctx = context()
    # Horovod numbers barrier like ops (join too: see join()); process set changes are not ops there.
    h = ctx.handles.allocate(1, internal=kind in ("add_process_set", "remove_process_set"))
    meta = Meta(name or kind, _CONTROL_CODES[kind], ps_id, splits=tuple(int(a) for a in args))
    return ctx.handles.wait(submit([Request(meta, None, None, h, 0)], h))


__all__ = ["current", "context", "install", "uninstall", "submit", "control", "lock"]

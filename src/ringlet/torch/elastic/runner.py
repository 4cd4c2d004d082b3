"""``hvd.elastic.run``: call a training function again after the membership changed."""
from __future__ import annotations

import functools
import gc
import logging

import ringlet
from ringlet.elastic import rendezvous
from ringlet.elastic.rendezvous import RendezvousError
from ringlet.types import CollectiveTimeout, PeerError

from .. import basics
from ..basics import HorovodInternalError
from .state import HostsUpdatedInterrupt

log = logging.getLogger("ringlet.torch.elastic")

# What a dead or departed peer looks like from this side: recoverable by a new generation.
RECOVERABLE = (HorovodInternalError, PeerError, CollectiveTimeout)


def run(func):
    """Decorator for ``func(state, *args, **kwargs)``, the body of an elastic training loop.

    Each attempt first syncs the state from rank 0 (unless the last one ended with a host update that
    needs none), then calls ``func``. Under ``ringlet run --elastic``:

    - a failed collective (``HorovodInternalError``, a dead peer): ``state.restore()`` (back to the last
      commit), re-initialise (``shutdown(); init()``: join the driver's next generation),
      ``state.on_reset()``, try again;
    - ``HostsUpdatedInterrupt`` (workers joined, raised by ``state.commit()`` on every rank at once):
      re-initialise without restoring, ``state.on_reset()``, try again.

    Without ``--elastic`` there is nobody to take over: errors propagate after the one call.
    Returns what ``func`` returns.
    """

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except RECOVERABLE as exc:
                if not rendezvous.enabled():
                    raise
                log.warning("ringlet.torch.elastic: rank %s: %s: %s; restoring the last commit and rejoining.",
                            _rank(), type(exc).__name__, _first_line(exc))
                # Peers blocked on this rank fail now rather than at their timeout.
                rendezvous.leave()
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                if not rendezvous.enabled():
                    raise
                skip_sync = exc.skip_sync
            reinit()
            state.on_reset()

    return wrapper


def reinit() -> None:
    """``shutdown(); init()`` until a generation is joined. A generation that cannot be built (a peer died
    while it assembled) is left for the next one; :class:`RendezvousError` (the job is stopping, or no
    generation within the elastic timeout) propagates."""
    while True:
        basics.shutdown()
        # The failed op's Gloo work objects live on in exception tracebacks (reference cycles); collecting
        # them now closes this rank's connections, which releases peers still blocked on it.
        gc.collect()
        try:
            basics.init()
            return
        except RendezvousError:
            raise
        except (RuntimeError, OSError) as exc:
            log.warning("ringlet.torch.elastic: joining a generation failed (%s: %s); waiting for the next one.",
                        type(exc).__name__, _first_line(exc))
            _drop_partial_init()


def _drop_partial_init() -> None:
    # init() may fail after torch.distributed's group or ringlet's runtime exist: drop both, or the next
    # init() would adopt the broken group instead of joining a new generation.
    ringlet.shutdown()
    basics._destroy_torch_group()
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _rank() -> str:
    try:
        return str(basics.rank())
    except ValueError:
        return "?"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""

"""Training state that survives a change of membership: commit (in-memory copy), restore, sync.

``commit()`` = ``save()`` then ``check_host_updates()``. The latter is *agreed*: rank 0 asks the
driver whether workers wait to join and broadcasts the answer, so every rank raises
:class:`HostsUpdatedInterrupt` at the same commit (a rank raising alone would leave the others
blocked in their next collective).
"""
from __future__ import annotations

import copy

import torch

from ringlet.elastic import rendezvous

from .. import mpi_ops
from ..basics import rank
from ..functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)


class HostsUpdatedInterrupt(RuntimeError):
    """Workers joined the job: raised by :meth:`State.commit` on every rank at the same commit.

    :func:`ringlet.torch.elastic.run` then re-initialises without restoring (the state was just
    committed). ``skip_sync``: the state need not be broadcast afterwards (never the case when
    workers joined: they need it).
    """

    def __init__(self, skip_sync: bool = False):
        super().__init__("the membership of the elastic job changed")
        self.skip_sync = skip_sync


class State:
    """Base of the elastic states: reset callbacks, commit and the agreed host-update check."""

    def __init__(self, bcast_object=None, get_rank=None):
        # Horovod's common State takes these two; ringlet's are fixed (kept for signature compatibility).
        self._bcast_object = bcast_object or broadcast_object
        self._get_rank = get_rank or rank
        self._reset_callbacks: list = []

    def register_reset_callbacks(self, callbacks) -> None:
        """Functions called (in order, no arguments) after every re-initialisation, e.g. to rescale the
        learning rate to the new ``hvd.size()``."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called by ``run`` after a re-initialisation: :meth:`reset`, then the reset callbacks."""
        self.reset()
        for cb in list(self._reset_callbacks):
            cb()

    def commit(self) -> None:
        """Save an in-memory copy of the state (what a failure rolls back to), then
        :meth:`check_host_updates`."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise :class:`HostsUpdatedInterrupt` on every rank when workers wait to join. Collective in an
        elastic job (every rank must call it, as ``commit`` does); a no-op otherwise."""
        if not rendezvous.enabled():
            return
        flag = 1 if self._get_rank() == 0 and rendezvous.hosts_updated() else 0
        agreed = mpi_ops.broadcast(torch.tensor([flag], dtype=torch.int32), 0,
                                   name="ringlet.elastic.hosts_updated")
        if int(agreed[0]):
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Hook for subclasses: adapt to the new membership (called before the reset callbacks)."""


class ObjectState(State):
    """Picklable values as attributes (``state.epoch``, ``state.batch``): ``save`` deep-copies them,
    ``restore`` puts the copy back, ``sync`` makes every rank take rank 0's committed values."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()
        super().__init__(bcast_object, get_rank)

    def save(self) -> None:
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, 0)
            self._set_attrs()

    def _set_attrs(self) -> None:
        # A copy: training mutating a restored list must not alter the commit.
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))


class _Handler:
    """Save/restore/sync of one object that carries its own state_dict."""

    def __init__(self, value):
        self.value = value
        self.save()

    def set_value(self, value) -> None:
        self.value = value
        self.save()

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        pass


class _ModelHandler(_Handler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self) -> None:
        # Indices recorded one by one (record_indices) are known only to the rank that recorded them.
        sd = self.value.state_dict()
        done: set = set()
        for part in allgather_object(sd["processed_indices"]):
            done |= set(part)
        sd["processed_indices"] = done
        self.value.load_state_dict(broadcast_object(sd, 0))

    def reset(self) -> None:
        self.value.reset()


def _handler_for(value):
    from .sampler import ElasticSampler

    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    return None


class TorchState(ObjectState):
    """Model, optimizer, samplers and plain values of a PyTorch training loop.

    Modules and optimizers are saved as deep copies of their ``state_dict()`` (restored with
    ``load_state_dict``, synced with ``broadcast_parameters`` / ``broadcast_optimizer_state``);
    :class:`ElasticSampler` values through their own ``state_dict`` (synced: the union of every rank's
    processed indices, then rank 0's epoch); any other keyword is a picklable value as in
    :class:`ObjectState`. Assigning ``state.model = other`` replaces the tracked object.
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for k, v in kwargs.items():
            h = _handler_for(v) if v is not None else None
            if h is not None:
                handlers[k] = h
            else:
                plain[k] = v
        object.__setattr__(self, "_handlers", handlers)
        for k, h in handlers.items():
            object.__setattr__(self, k, h.value)
        super().__init__(**plain)

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        object.__setattr__(self, name, value)

    def _each(self, method: str) -> None:
        for h in self._handlers.values():
            getattr(h, method)()

    def save(self) -> None:
        self._each("save")
        super().save()

    def restore(self) -> None:
        self._each("restore")
        super().restore()

    def sync(self) -> None:
        self._each("sync")
        super().sync()

    def reset(self) -> None:
        self._each("reset")

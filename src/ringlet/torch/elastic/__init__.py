"""Horovod's elastic training on ringlet: ``hvd.elastic.run``, ``TorchState``, ``ElasticSampler``.

A script written for Horovod elastic runs unchanged with ``import ringlet.torch as hvd`` under
``ringlet run --elastic -np N --min-np M [--restarts K] -- python train.py``::

    state = hvd.elastic.TorchState(model=model, optimizer=opt, train_sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()          # in-memory copy; raises HostsUpdatedInterrupt when workers joined

    train(state)

When a worker dies, the survivors' next collective fails (``HorovodInternalError``); ``run`` restores
the last commit, re-initialises ringlet with the new membership decided by the driver
(:mod:`ringlet.launch.elastic`), calls the reset callbacks and calls the function again (after
broadcasting rank 0's state). Without ``--elastic`` the decorator only syncs the state and calls the
function, so the same script also runs under plain ``ringlet run``.
"""
from __future__ import annotations

from .runner import run
from .sampler import ElasticSampler
from .state import HostsUpdatedInterrupt, ObjectState, State, TorchState

__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "run"]

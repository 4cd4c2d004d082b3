"""Straggler detection while training: which rank is persistently slower than the others, and why.

Each training front end (:class:`ringlet.torch.DistributedDataParallel`, the Horovod-style
``DistributedOptimizer``, ZeRO) reports its step's moments to its runtime's :class:`~.stepmeter.StepMeter`
(:func:`meter`); the meter keeps trimmed means of the step's compute time and of the time blocked in
collectives, and (through :class:`ringlet.transport.base.LinkCounter`) how long this rank's large
sends block per peer. The liveness monitor shares each rank's summary on its heartbeat (:mod:`.share`)
and :class:`~.detect.Detector` names a compute-bound or network-bound straggler in the log (one
WARNING when it starts, one when it recovers), on the timeline (``ringlet report`` lists them) and in
:func:`scores`. ``RINGLET_STRAGGLER=0`` turns it off; see docs/stragglers.md for every variable.

The verdicts need the liveness monitor (a launcher's store: ``ringlet run``, torchrun); without one the
meter still measures, and nothing is shared.
"""
from __future__ import annotations

import weakref

from .detect import Change, Detector
from .stepmeter import NullMeter, StepMeter
from .options import StragglerOptions

_meters: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def meter(rt=None) -> StepMeter | NullMeter:
    """The step meter of runtime ``rt`` (default: the calling thread's), made on first use: a
    :class:`NullMeter` when ``RINGLET_STRAGGLER=0``, the job has one rank or ringlet is not initialised.
    Making it attaches a link counter to the runtime's transport and, when the runtime has a liveness
    monitor, the sharing task. ``ValueError`` for a bad ``RINGLET_STRAGGLER*`` variable."""
    if rt is None:
        from ..collectives import runtime

        try:
            rt = runtime()
        except ValueError:
            return NullMeter()
    m = _meters.get(rt)
    if m is None:
        m = _meters[rt] = _attach(rt)
    return m


def _attach(rt):
    from ..transport.base import LinkCounter

    opts = StragglerOptions.from_env()
    if not opts.enabled or rt.size < 2:
        return NullMeter()
    links = None
    if rt.transport.links is None:
        links = LinkCounter(opts.link_min_bytes)
        rt.transport.links = links
    m = StepMeter(opts, links)
    monitor = getattr(rt, "monitor", None)
    if monitor is not None:
        from .share import Sharer

        monitor.add_task(Sharer(m, rt.rank, rt.size, rt.hostnames, reporter=rt.rank == 0))
    return m


def scores(rt=None) -> dict[int, float]:
    """Each rank's straggler score from the last check of runtime ``rt``'s detector: how much slower than
    the others it is (compute: its compute over the others' median, less 1; network: its host's
    slowest link's blocked share over the other links' median (at least 1%), less 1), 0 for a rank that
    is not slower. Empty before the first check, without a monitor or a meter, or when ringlet is not initialised; never
    makes a meter."""
    if rt is None:
        from ..collectives import runtime

        try:
            rt = runtime()
        except ValueError:
            return {}
    try:
        m = _meters.get(rt)
    except TypeError:  # not a runtime (one that cannot be weakly referenced): it has no meter
        return {}
    return m.scores() if m is not None else {}


__all__ = ["Change", "Detector", "NullMeter", "StepMeter", "StragglerOptions", "meter", "scores"]

"""ringlet: gradient synchronisation for distributed PyTorch, collectives written as schedules.

Quick use::

    import ringlet
    ringlet.init()                      # transport from how the job was launched (ringlet run)
    out = ringlet.allreduce(t, op="sum")
"""
from __future__ import annotations

import atexit

from . import algorithms, flight, stall
from .elastic import rendezvous as _elastic
from .collectives import (allgather, allgather_async, allreduce, allreduce_, allreduce_async,
                          allreduce_async_, alltoall, alltoall_async, barrier, barrier_async, broadcast,
                          broadcast_, broadcast_async, broadcast_async_, reduce, reduce_, reduce_async,
                          reduce_async_, reduce_scatter, reduce_scatter_async, use_runtime)
from .group import Group
from .p2p import P2P_TAGS, irecv, isend, recv, send
from .runtime import Runtime, Work
from .types import (SUPPORTED_DTYPES, CollectiveTimeout, MismatchError, Options, PeerError, ReduceOp,
                    RingletError)

__version__ = "0.1.0"

SUM, AVG, MIN, MAX, PRODUCT = ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT
_atexit_registered = False


def init(transport=None, options: Options | None = None) -> Runtime:
    """Start ringlet in this process. A second call while initialised is a no-op.

    ``transport``: a name (``"torch"``, ``"mpi"``, ``"shm"``), a ready :class:`~ringlet.transport.Transport`, or
    ``None`` to follow the launcher (``RINGLET_TRANSPORT``, torchrun's, mpiexec's or an ``srun`` step's env: see
    docs/launching.md; a lone process gets a world of one).

    Over the shm transport in a job started with torchrun's env:// variables (``ringlet run`` on one
    host), torch.distributed's default Gloo group is created too, as the torch transport does, so that
    scripts that also call torch.distributed (torch's DDP, its comm hooks) find it; :func:`shutdown`
    destroys it. A default group that already exists is left alone.

    The job's network model comes from its calibration profile (``ringlet tune``): ``RINGLET_TUNE``
    (``load``, the default; ``auto`` also calibrates when none matches; ``off``) and ``RINGLET_PROFILE``
    (a path), or the same fields of ``options``; see docs/tuning.md. A profile file that is not one
    raises ``ValueError`` naming it, on every rank.
    """
    global _atexit_registered
    from . import collectives, memory
    from .slurm.rendezvous import prepare as _slurm_world
    from .transport import Transport, create, detect

    if collectives._runtime is not None:
        return collectives._runtime
    decay = memory.decay_interval()  # a bad RINGLET_MALLOC_DECAY raises before anything starts
    stall_options = stall.StallOptions.from_env()  # so does a bad RINGLET_STALL_WARN_S / _SHUTDOWN_S
    if isinstance(transport, Transport):
        tr = transport
    else:
        _slurm_world(transport)  # a task of srun: the step's world (docs/launching.md); raises when it is wrong
        name = (transport or detect()).strip().lower()
        if name == "shm":
            _torch_group_beside((options or Options.from_env()).timeout)
        tr = create(name, join=_elastic.group_join())
    rt = Runtime(tr, options)
    try:
        from .engine.probe import Prober
        from .tuning.autoload import attach

        # rt.network_model and rt.selector from the matching calibration profile (RINGLET_TUNE, RINGLET_PROFILE)
        attach(rt, Prober(rt))
        _start_metrics(rt)
    except BaseException:
        rt.close()
        raise
    collectives._set_runtime(rt)
    from . import liveness

    rt.monitor = liveness.start(rt)  # silent peers: RINGLET_PEER_TIMEOUT (docs/reliability.md)
    rt.stall = stall.start(rt, stall_options)  # long waits explained: RINGLET_STALL_WARN_S (docs/reliability.md)
    rt.heap_decay = memory.start(decay)  # memory that stayed free goes back to the OS (RINGLET_MALLOC_DECAY)
    from . import timeline

    timeline.configure_from_env(rt.rank)  # RINGLET_TIMELINE / HOROVOD_TIMELINE also for scripts using hooks only
    if not _atexit_registered:
        atexit.register(shutdown)  # also leaves the flight record of a rank that exits without shutdown()
        _atexit_registered = True
    flight.install_signal_handler(lambda: collectives._runtime and collectives._runtime.recorder)  # USR1, TERM
    return rt


def _start_metrics(rt: Runtime) -> None:
    """The rank's metrics endpoint when RINGLET_METRICS_PORT or RINGLET_METRICS_DIR asks for one
    (docs/metrics.md); prometheus_client is imported only then."""
    import os

    if os.environ.get("RINGLET_METRICS_PORT", "").strip() or os.environ.get("RINGLET_METRICS_DIR", "").strip():
        from . import metrics

        metrics.start(rt)


def dump(path: str | None = None) -> str:
    """Write this rank's flight record (its last collectives, :mod:`ringlet.flight`) as JSON to ``path``
    or ``$RINGLET_FLIGHT_DIR/rank-<R>.json``; return the path. ``ringlet diagnose DIR`` reads them."""
    return _rt().recorder.dump(path, reason="ringlet.dump()")


_owns_torch_group = False  # init created torch's default group beside the shm transport


def _torch_group_beside(timeout: float) -> None:
    global _owns_torch_group
    import os

    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return
    if not all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return
    from .transport.torchdist import init_default_group

    init_default_group(timeout)
    _owns_torch_group = True


def shutdown() -> None:
    """Finish queued collectives, close the transport and forget the runtime; ``init`` may follow."""
    global _owns_torch_group
    from . import collectives

    rt = collectives._runtime
    if rt is not None:
        collectives._set_runtime(None)
        _dump_at_exit(rt)
        if rt.stall is not None:
            rt.stall.stop()
        if rt.monitor is not None:
            rt.monitor.stop(clean=True)
        if rt.heap_decay is not None:
            rt.heap_decay.stop()
        rt.close()
    if _owns_torch_group:
        from .transport.torchdist import destroy_default_group

        _owns_torch_group = False
        destroy_default_group()


SHUTDOWN_TAIL = 64  # records per group a rank leaves at shutdown (a failure or a request writes them all)


def _dump_at_exit(rt: Runtime) -> None:
    """Leave the flight record of a rank that shuts down (each group's last records, so that its last
    sequence numbers are known); never raises."""
    if not rt.recorder.enabled or not rt.recorder.records:
        return
    try:
        rt.recorder.dump(reason="shutdown", tail=SHUTDOWN_TAIL)
    except OSError as err:
        import logging

        logging.getLogger("ringlet").warning("flight recorder: could not write its record: %s", err)


def is_initialized() -> bool:
    from . import collectives

    return collectives._runtime is not None


def _rt() -> Runtime:
    from .collectives import runtime

    return runtime()


def rank() -> int:
    """This process's rank in the world."""
    return _rt().rank


def size() -> int:
    """Number of ranks in the world."""
    return _rt().size


def local_rank() -> int:
    """Rank among the processes of this host."""
    return _rt().local_rank()


def local_size() -> int:
    """Number of processes on this host."""
    return _rt().local_size()


def cross_rank() -> int:
    """Index of this host among the hosts (ranks with the same local rank, in rank order)."""
    return _rt().cross_rank()


def cross_size() -> int:
    """Number of hosts that have a process with this local rank."""
    return _rt().cross_size()


def wire_bytes():
    """What this process's transport has moved since it was created, as a
    :class:`~ringlet.transport.WireCount` (``sent``, ``received``, ``messages_sent``,
    ``messages_received``, ``native``); subtract two snapshots for what moved in between::

        before = ringlet.wire_bytes()
        ringlet.allreduce(t, compression="fp16")
        print((ringlet.wire_bytes() - before).sent)
    """
    return _rt().transport.wire.snapshot()


def new_group(ranks) -> Group:
    """A sub-group of global ``ranks``. Every rank of the world calls it, in the same order.

    Message tags have 31 group slots (a 32nd carries point-to-point messages); groups with at most one
    rank in common share a slot. A new group raises ``RuntimeError`` on every rank when groups with two or more of its ranks already hold all 31
    (for instance 30 earlier groups over the same two ranks, and the world)."""
    return _rt().new_group(ranks)


__all__ = [
    "init", "shutdown", "dump", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "new_group", "wire_bytes", "Group", "Work", "Options", "ReduceOp", "SUM", "AVG", "MIN", "MAX", "PRODUCT",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "reduce", "reduce_", "reduce_async", "reduce_async_",
    "allgather", "allgather_async", "reduce_scatter", "reduce_scatter_async", "alltoall", "alltoall_async",
    "barrier", "barrier_async", "isend", "irecv", "send", "recv", "P2P_TAGS", "use_runtime", "algorithms",
    "SUPPORTED_DTYPES", "RingletError",
    "MismatchError", "PeerError", "CollectiveTimeout", "Runtime",
]

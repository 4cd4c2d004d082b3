"""Lifecycle and topology of ``ringlet.torch``: init/shutdown (re-init allowed), ranks, build flags.

State lives in a :class:`Context` (runtime, coordinator, handle table, process sets). There is one
per process; in-process unit tests that run ranks as threads under ``ringlet.use_runtime`` get one per
thread, because :func:`init` notices the thread's runtime and keeps the context thread-local too.
"""
from __future__ import annotations

import atexit
import time
import weakref

import ringlet
from ringlet import collectives as _core

from . import context as _state
from .context import context
from .coordinator import Coordinator
from .errors import HorovodInternalError
from .handles import HandleTable
from .ordered_grads import serve_join
from .process_sets import Registry, add_process_set


class Context:
    """Everything one initialised rank owns; dropped as a whole by :func:`shutdown`."""

    def __init__(self, rt, owns_runtime: bool):
        self.rt = rt
        self.owns_runtime = owns_runtime
        # The coordinator's own world group: its own tag sequence, so it can run beside core ringlet
        # collectives (e.g. DistributedDataParallel's) issued from other threads without interleaving.
        self.world = rt.new_group(range(rt.size))
        self.handles = HandleTable()
        self.process_sets = Registry(self)
        self.coordinator = Coordinator(self)
        # The FusedGradients of the live DistributedOptimizers of the world by serial number (creation
        # order): a rank in join() mirrors the steps the others take (ringlet.torch.ordered_grads).
        self.fused_gradients: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.fused_serial = 0

    def serve_join(self, handle: int) -> None:
        """This rank has joined (``handle``: its join request): mirror the others' steps of the world's fused
        optimizers with zeros until every rank has joined (:func:`ringlet.torch.ordered_grads.serve_join`).
        Serving starts once the coordinator has announced this rank's join, so a rank that steps after
        it joins later in the coordinator's order too (``join()`` returns the last rank to join)."""
        live = dict(self.fused_gradients)
        if not live:
            return
        while not (self.handles.poll(handle) or self.rt.rank in self.coordinator.joined()):
            time.sleep(0.001)
        serve_join(live)

    def close(self) -> None:
        self.coordinator.stop()
        self.handles.fail_all(HorovodInternalError("ringlet.torch has been shut down; pending operations "
                                                   "were cancelled."))


_atexit_registered = False
_owns_dist = False


def _init_torch_group() -> None:
    """Create torch.distributed's default group (per-generation store prefix, see
    :func:`ringlet.transport.torchdist.init_default_group`); ringlet's torch transport adopts it and
    :func:`shutdown` destroys it."""
    global _owns_dist
    import torch.distributed as dist

    from ringlet.elastic import rendezvous
    from ringlet.transport import detect
    from ringlet.transport.torchdist import init_default_group
    from ringlet.types import Options

    if detect() != "torch" or not dist.is_available() or dist.is_initialized():
        return
    init_default_group(Options.from_env().timeout, rendezvous.group_join())
    _owns_dist = True


def _destroy_torch_group() -> None:
    global _owns_dist
    if _owns_dist:
        from ringlet.transport.torchdist import destroy_default_group

        _owns_dist = False
        destroy_default_group()


_ctx_or_none = _state.current


def init(comm=None, process_sets=None) -> None:
    """Start ringlet for a Horovod-style script. A second call while initialised is a no-op.

    ``comm`` is accepted for signature compatibility (an mpi4py communicator is not needed: the
    transport follows the launcher). ``process_sets``: a list of :class:`ProcessSet` registered
    collectively right away, or ``"dynamic"`` (sets may be added later with ``add_process_set``;
    ringlet always allows that). Registers :func:`shutdown` at interpreter exit.
    """
    global _atexit_registered
    if comm is not None and not isinstance(comm, (list, tuple)) and not hasattr(comm, "Get_rank"):
        raise ValueError("comm must be an mpi4py communicator or a list of ranks.")
    from ringlet import stall

    stall_options = stall.StallOptions.from_env(horovod=True)  # a bad HOROVOD_STALL_* raises here
    with _state.lock:
        if _ctx_or_none() is not None:
            return
        thread_rt = getattr(_core._local, "runtime", None)
        if thread_rt is not None:
            ctx = Context(thread_rt, owns_runtime=False)
            _state.install(ctx, thread_local=True)
        else:
            _init_torch_group()
            ctx = Context(ringlet.init(), owns_runtime=True)
            _state.install(ctx, thread_local=False)
            if not _atexit_registered:
                atexit.register(shutdown)
                _atexit_registered = True
    from ringlet import timeline

    timeline.configure_from_env(ctx.rt.rank)
    if ctx.owns_runtime:  # HOROVOD_STALL_* where RINGLET_STALL_* are not given, for the runtime it started
        stall.use_horovod_env(ctx.rt, stall_options)
    ctx.coordinator.start()
    if process_sets is not None and process_sets != "dynamic":
        for ps in process_sets:
            add_process_set(ps)


def shutdown() -> None:
    """Stop the background coordinator, fail pending handles and close the transport; ``init`` may follow.

    The handle counter (and with it ``noname`` numbering) restarts after re-init, as in Horovod.
    """
    with _state.lock:
        ctx = _state.uninstall()
    if ctx is None:
        return
    ctx.close()
    if ctx.owns_runtime:
        ringlet.shutdown()
        _destroy_torch_group()


def is_initialized() -> bool:
    """True between :func:`init` and :func:`shutdown`."""
    return _ctx_or_none() is not None


def size() -> int:
    """Number of ranks in the job."""
    return context().rt.size


def rank() -> int:
    """This process's global rank."""
    return context().rt.rank


def local_size() -> int:
    """Number of ranks on this host."""
    return context().rt.local_size()


def local_rank() -> int:
    """Rank among the processes of this host."""
    return context().rt.local_rank()


def cross_size() -> int:
    """Number of hosts that have a process with this local rank."""
    return context().rt.cross_size()


def cross_rank() -> int:
    """Index of this host among the hosts with a process of this local rank."""
    return context().rt.cross_rank()


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    rt = context().rt
    counts: dict[int, int] = {}
    for h in rt.world.host_of:
        counts[h] = counts.get(h, 0) + 1
    return len(set(counts.values())) == 1


# ---- build / backend flags (callable before init) ------------------------------------------------
def _transport_name() -> str:
    ctx = _ctx_or_none()
    if ctx is not None:
        return ctx.rt.transport.name
    from ringlet.transport import detect

    return detect()


def mpi_built() -> bool:
    """True when mpi4py is importable (ringlet's MPI transport can run)."""
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None


def gloo_built() -> bool:
    """True when torch.distributed (Gloo) is available."""
    import torch.distributed as dist

    return dist.is_available()


def mpi_enabled() -> bool:
    """True when this job moves data over MPI."""
    return _transport_name() == "mpi"


def gloo_enabled() -> bool:
    """True when this job moves data over torch.distributed (Gloo)."""
    return _transport_name() == "torch"


def nccl_built() -> int:
    """NCCL version code as an int when torch has NCCL and CUDA is usable, else 0 (as Horovod)."""
    import torch

    if not torch.cuda.is_available():
        return 0
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - no NCCL in this build
        return 0
    if isinstance(v, tuple):
        return v[0] * 1000 + v[1] * 100 + (v[2] if len(v) > 2 else 0)
    return int(v)


def cuda_built() -> bool:
    import torch

    return torch.version.cuda is not None


def rocm_built() -> bool:
    import torch

    return getattr(torch.version, "hip", None) is not None


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def mpi_threads_supported() -> bool:
    """Whether MPI runs with MPI_THREAD_MULTIPLE; ``ValueError`` when MPI is not in use (as Horovod)."""
    if not mpi_enabled():
        raise ValueError("MPI is not in use in this job (mpi_threads_supported needs the mpi transport).")
    from mpi4py import MPI

    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


__all__ = ["HorovodInternalError", "init", "shutdown", "is_initialized", "size", "rank", "local_size",
           "local_rank", "cross_size", "cross_rank", "is_homogeneous", "mpi_built", "gloo_built",
           "mpi_enabled", "gloo_enabled", "nccl_built", "cuda_built", "rocm_built", "ddl_built", "ccl_built",
           "mpi_threads_supported"]

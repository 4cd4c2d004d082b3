"""torch.distributed as a transport: Gloo point-to-point for CPU tensors, NCCL for CUDA tensors.

Bootstraps from the standard ``env://`` variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``) that torchrun and ``ringlet run`` set, or reuses the default process group when
the application already initialised ``torch.distributed``.

Gloo facts this file relies on (measured with torch 2.x):

- p2p ``isend``/``irecv`` carry a tag; messages of one (src, dst, tag) are matched in posting order.
- a wait that times out *closes the pair* with that peer ("Application timeout caused pair closure"):
  after a :class:`~ringlet.types.CollectiveTimeout` the connection to that peer is unusable, which is
  the usual contract of a collective timeout (the job is expected to stop).
- ``all_reduce`` supports every ringlet dtype except int16 (``Invalid scalar type``).
- in an exchange, posting ``irecv`` before ``isend`` avoids stalls; the executor already does.
"""
from __future__ import annotations

import datetime
import logging
import os
import threading

import torch

from ..types import CollectiveTimeout, Options, PeerError, ReduceOp
from ._gloo_guard import creating_gloo, secure_gloo
from ._gloo_watch import check_strangers as _check_strangers
from ._sockets import SocketSet
from ._waiter import Waiter
from .base import Capabilities, Handle, PostingTransport, nbytes

log = logging.getLogger(__name__)

# Dtypes Gloo's all_reduce accepts; anything else makes ``native_allreduce`` return False.
_GLOO_ALLREDUCE_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                    torch.int8, torch.uint8, torch.int32, torch.int64})


def _dist():
    import torch.distributed as dist

    return dist


def _is_timeout(exc: BaseException) -> bool:
    msg = str(exc).lower()
    # "Application timeout caused pair closure" is what later ops on a pair see after a timeout.
    return "timed out" in msg or ("timeout" in msg and "pair closure" not in msg)


# Sockets of the Gloo groups this process made (see ``_sockets``): shut down by ``TorchTransport.abort``.
gloo_sockets = SocketSet()
_waiter = Waiter()  # blocking waits that an abort interrupts (see ``_waiter``)


def _translate(exc: BaseException, rank: int, what: str, peer: int | None, tag: int | None,
               timeout: float | None, aborted: PeerError | None = None) -> Exception:
    """Map a torch.distributed error to ringlet's: a timeout or a dead/closed peer (``aborted``: the
    error the transport was aborted with, which names the peer that caused it)."""
    if aborted is not None:
        return PeerError(str(aborted), rank=getattr(aborted, "rank", None), host=getattr(aborted, "host", None))
    where = f"rank {rank}: {what}"
    if peer is not None:
        where += f" with peer rank {peer}"
    if tag is not None:
        where += f" (tag {tag})"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if _is_timeout(exc):
        limit = f" after {timeout:.1f}s" if timeout is not None else ""
        return CollectiveTimeout(f"{where} timed out{limit}: {first}")
    return PeerError(f"{where} failed (peer died or connection closed): {first}")


class TorchHandle(Handle):
    """A pending ``dist.isend``/``dist.irecv`` (or async all-reduce)."""

    __slots__ = ("work", "rank", "peer", "tag", "what", "buf", "owner")

    def __init__(self, work, rank: int, peer: int | None, tag: int | None, what: str, buf: torch.Tensor,
                 owner: "TorchTransport | None" = None):
        # ``buf`` keeps the memory alive while the backend may still touch it; ``owner``: the transport
        # (its abort releases the wait, and its error names the culprit).
        self.work, self.rank, self.peer, self.tag, self.what, self.buf, self.owner = (
            work, rank, peer, tag, what, buf, owner)

    def wait(self, timeout: float | None = None) -> None:
        work, owner = self.work, self.owner
        if timeout is None:
            job = work.wait
        else:
            # A zero timedelta means "no timeout" to c10d; never pass it for a real deadline.
            limit = datetime.timedelta(seconds=max(timeout, 1e-3))

            def job():
                work.wait(timeout=limit)
        try:
            if owner is None:
                job()
            else:
                _waiter.wait(job, owner.aborted_or_none)
        except PeerError:
            raise
        except Exception as exc:  # noqa: BLE001 - translated to ringlet's error types
            aborted = owner.aborted if owner is not None else None
            raise _translate(exc, self.rank, self.what, self.peer, self.tag, timeout, aborted) from exc

    def done(self) -> bool:
        return self.work.is_completed()


_generation = 0  # default groups this process created and destroyed (the same count on every rank)


def init_default_group(timeout: float, join=None) -> None:
    """Create torch.distributed's default Gloo group from the env:// variables, under a store prefix
    unique to this process's init/shutdown generation.

    Re-initialising over the same rendezvous store would otherwise read the previous generation's
    Gloo addresses and connect to dead sockets (seen as hangs or "connection reset" after
    ``shutdown(); init()``). Every rank goes through the same generations, so the prefixes agree.
    ``join``: a callable returning ``(store, rank, world_size)`` that replaces the env:// rendezvous
    (``ringlet run --elastic`` passes :func:`ringlet.elastic.rendezvous.group_args`).
    """
    dist = _dist()
    if join is not None:
        store, rank, world = join()
    else:
        store, rank, world = _env_rendezvous(timeout)
        store = dist.PrefixStore(f"ringlet/{_generation}", store)
    gloo_sockets.before()
    try:
        with creating_gloo() as opened_before:
            dist.init_process_group(backend="gloo", store=store, rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=timeout))
        secure_gloo(dist.group.WORLD, opened_before, timeout)
    finally:
        gloo_sockets.after()


def _new_group(*args, auth_timeout: float, **kwargs):
    """``dist.new_group``, with the sockets it opens recorded in :data:`gloo_sockets`; a Gloo group is
    bound and authenticated as :mod:`._gloo_guard` describes (``auth_timeout``: seconds per round)."""
    gloo_sockets.before()
    try:
        with creating_gloo() as opened_before:
            pg = _dist().new_group(*args, **kwargs)
        if kwargs.get("backend") == "gloo":
            secure_gloo(pg, opened_before, auth_timeout)
        return pg
    finally:
        gloo_sockets.after()


def _env_rendezvous(timeout: float):
    """(store, rank, world size) of the ``env://`` variables: the launcher's store (authenticated under
    ``ringlet run``), or, when the launcher has none, a bounded ``env://`` rendezvous that names what is
    wrong on every rank (:mod:`._env_join`)."""
    from ..store.torch_store import job_store
    from ._env_join import env_rendezvous

    store = job_store(timeout)
    if store is None:
        return env_rendezvous(timeout, _generation, os.environ)
    return store, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def destroy_default_group() -> None:
    """Destroy the default group created by :func:`init_default_group` and move to the next generation."""
    global _generation
    _generation += 1
    dist = _dist()
    if dist.is_initialized():
        dist.destroy_process_group()


class TorchTransport(PostingTransport):
    """Point-to-point over torch.distributed; ``native_allreduce`` is ``dist.all_reduce``."""

    name = "torch"
    # Posts go through ``_post_lock``; each thread waits on a helper of its own (``_waiter``).
    capabilities = Capabilities(native_digest=True, group_setup=True, native_dtypes=_GLOO_ALLREDUCE_DTYPES,
                                threaded_posts=True)

    def __init__(self, *, owns_group: bool, nccl: bool | None = None, timeout: float | None = None,
                 own_world: bool = False):
        dist = _dist()
        self._timeout = Options.from_env().timeout if timeout is None else timeout
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        self._owns_group = owns_group
        self._closed = False
        self.aborted: PeerError | None = None
        self._post_lock = threading.Lock()
        # group ranks tuple -> process group (None means the default group); CPU and CUDA flavours.
        world = self._world = tuple(range(self.size))
        self._cpu_groups: dict[tuple[int, ...], object] = {world: None}
        self._cuda_groups: dict[tuple[int, ...], object] = {}
        self._created: list = []
        self._p2p_pg: dict[bool, object] = {False: None, True: None}  # is_cuda -> world process group
        if nccl is None:
            nccl = torch.cuda.is_available() and dist.is_nccl_available()
        self._nccl = bool(nccl)
        # The default group may be "gloo", "nccl" or a per-device mix such as "cpu:gloo,cuda:nccl".
        backend = str(dist.get_backend()).lower()
        if self._nccl:
            if "nccl" in backend:
                self._cuda_groups[world] = None
            else:
                pg = _new_group(backend="nccl", auth_timeout=self._timeout)
                self._created.append(pg)
                self._cuda_groups[world] = pg
        if own_world or not any(b in backend for b in ("gloo", "mpi", "ucc")):
            # A Gloo group beside the default one: asked for, or a user-made NCCL-only default group
            # cannot move CPU tensors.
            pg = _new_group(backend="gloo", auth_timeout=self._timeout)
            self._created.append(pg)
            self._cpu_groups[world] = pg
        elif not owns_group:
            # The script's own default group carries ringlet's CPU traffic: authenticate its pairs too
            # (its listeners are not known, so they are not watched).
            secure_gloo(dist.group.WORLD, None, self._timeout)

    @classmethod
    def available(cls) -> bool:
        try:
            return _dist().is_available()
        except Exception:  # noqa: BLE001
            return False

    @classmethod
    def from_env(cls, options: Options | None = None, join=None) -> "TorchTransport":
        """Join the job described by torchrun's env (or the already initialised default group); ``join``
        as for :func:`init_default_group`."""
        dist = _dist()
        if not dist.is_available():
            raise RuntimeError("torch.distributed is not available in this torch build.")
        opts = options or Options.from_env()
        if dist.is_initialized():
            return cls(owns_group=False, timeout=opts.timeout)
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing and join is None:
            raise RuntimeError("The torch transport needs the env:// variables set by torchrun or `ringlet run` "
                               f"(missing: {', '.join(missing)}). Launch with `ringlet run -np N -- ...`.")
        init_default_group(opts.timeout, join)
        return cls(owns_group=True, timeout=opts.timeout)

    @classmethod
    def beside_default_group(cls, options: Options | None = None) -> "TorchTransport":
        """Join the script's already initialised default group, but carry ringlet's CPU traffic on a
        Gloo group of its own (created here, collectively: every rank must call this at the same point),
        so that it never shares a group with the script's own collectives."""
        opts = options or Options.from_env()
        return cls(owns_group=False, timeout=opts.timeout, own_world=True)

    # ---- point to point ------------------------------------------------------------------
    def _group_for(self, buf: torch.Tensor, ranks: tuple[int, ...]):
        table = self._cuda_groups if buf.is_cuda else self._cpu_groups
        if buf.is_cuda and not self._nccl:
            raise ValueError("A CUDA tensor reached the torch transport, but no NCCL group exists "
                             "(CUDA or NCCL unavailable); move the tensor to the CPU.")
        if ranks not in table:
            raise ValueError(f"No process group for ranks {list(ranks)}; create it with ringlet.new_group.")
        return table[ranks]

    def _check_open(self) -> None:
        if self._closed:
            raise PeerError(f"rank {self.rank}: the torch transport has been closed")

    def aborted_or_none(self) -> PeerError | None:
        """A fresh copy of the abort error, or None while the transport is not aborted."""
        return None if self.aborted is None else self.aborted_error()

    def abort(self, error: PeerError) -> None:
        """Fail every pending and later operation with ``error`` (a silent peer was found).

        No Python call interrupts a Gloo wait, and Gloo does not always fail the operations pending on
        a connection that goes away: waits run on a helper thread per caller (``_waiter``), and the
        caller stops waiting and raises ``error`` within a quarter of a second. Posting and aborting
        exclude each other, then the connections of the Gloo groups ringlet made are shut down, so
        the peers' pending operations fail too."""
        with self._post_lock:
            if self.aborted is not None:
                return
            self.aborted = error
        gloo_sockets.shutdown_connections()

    def check_strangers(self) -> list:
        """Report and refuse connections to this process's Gloo listeners that are not the job's
        authenticated peers (see :func:`._gloo_watch.check_strangers`); their remote addresses."""
        return _check_strangers()

    def _p2p_group(self, buf: torch.Tensor):
        """The process group object that carries point-to-point messages of ``buf``'s device.

        Messages go straight to its ``send``/``recv`` (what ``dist.isend`` ends in after its argument
        checks, which the executor's contiguous 1-D views always pass): the wrappers' cost is paid per
        message, and an all-reduce posts dozens."""
        cuda = buf.is_cuda
        pg = self._p2p_pg[cuda]
        if pg is None:
            group = self._group_for(buf, self._world)
            pg = self._p2p_pg[cuda] = group if group is not None else _dist().group.WORLD
        return pg

    def _post(self, buf: torch.Tensor, peer: int, tag: int, what: str) -> Handle:
        pg = self._p2p_group(buf)
        try:
            with self._post_lock:
                if self.aborted is not None:
                    raise self.aborted_error()
                work = pg.send([buf], peer, tag) if what == "send" else pg.recv([buf], peer, tag)
        except PeerError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, self.rank, what, peer, tag, None, self.aborted) from exc
        return TorchHandle(work, self.rank, peer, tag, what, buf, self)

    # ---- the backend's own all-reduce ----------------------------------------------------
    def native_allreduce(self, buf: torch.Tensor, op, ranks: tuple[int, ...]) -> bool:
        """``dist.all_reduce`` over the process group of ``ranks``. AVG runs as SUM: the collective
        layer scales afterwards. False when the backend cannot reduce this dtype/op."""
        self._check_open()
        dist = _dist()
        op = ReduceOp.parse(op)
        table = {ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.AVG: dist.ReduceOp.SUM,
                 ReduceOp.MIN: dist.ReduceOp.MIN, ReduceOp.MAX: dist.ReduceOp.MAX,
                 ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT}
        if op not in table:
            return False
        if not buf.is_cuda and buf.dtype not in _GLOO_ALLREDUCE_DTYPES:
            return False
        group = self._group_for(buf, tuple(ranks))
        try:
            with self._post_lock:
                if self.aborted is not None:
                    raise self.aborted_error()
                work = dist.all_reduce(buf, table[op], group=group, async_op=True)
        except PeerError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, self.rank, "native all-reduce", None, None, None, self.aborted) from exc
        TorchHandle(work, self.rank, None, None, f"native all-reduce over ranks {list(ranks)}", buf,
                    self).wait(self._timeout)
        self.wire.native(nbytes(buf))
        return True

    def on_new_group(self, group_id: int, ranks: tuple[int, ...]) -> None:
        """Create the process group(s) for a ringlet sub-group. Every rank calls this in the same
        order (``dist.new_group`` is collective over the world)."""
        dist = _dist()
        ranks = tuple(ranks)
        if ranks in self._cpu_groups and (not self._nccl or ranks in self._cuda_groups):
            return
        if ranks not in self._cpu_groups:
            pg = _new_group(list(ranks), backend="gloo", auth_timeout=self._timeout)
            self._created.append(pg)
            self._cpu_groups[ranks] = pg
        if self._nccl and ranks not in self._cuda_groups:
            pg = _new_group(list(ranks), backend="nccl", auth_timeout=self._timeout)
            self._created.append(pg)
            self._cuda_groups[ranks] = pg

    def close(self) -> None:
        """Destroy the process groups this transport created (the default one only if it created it)."""
        if self._closed:
            return
        self._closed = True
        dist = _dist()
        if not dist.is_initialized():
            return
        try:
            if self._owns_group:
                destroy_default_group()
            else:
                for pg in self._created:
                    if pg is not None and pg != dist.GroupMember.NON_GROUP_MEMBER:
                        dist.destroy_process_group(pg)
        except Exception as exc:  # noqa: BLE001 - closing after a failure must not mask the failure
            log.debug("ringlet: destroying process groups failed: %s", exc)

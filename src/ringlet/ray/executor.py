"""``RayExecutor``: Horovod's ``horovod.ray.RayExecutor`` API over ringlet, its workers Ray actors.

::

    from ringlet.ray import RayExecutor
    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=4, cpus_per_worker=1, use_gpu=False)
    executor.start()
    results = executor.run(train_fn, kwargs={"epochs": 5})   # each rank's return value, in rank order
    executor.shutdown()

In each worker, ``ringlet.init()`` / ``hvd.init()`` forms the job over the torch transport (Gloo between
the actors), meeting at the store the driver hosts (:mod:`.job`). See docs/ray.md.
"""
from __future__ import annotations

from .job import JobStore, rank_order
from .results import Gather
from .settings import RaySettings, import_ray
from .worker import RingletWorker

# Horovod's RayExecutor arguments this executor does not offer (elastic Ray jobs, host-count placement).
_NOT_OFFERED = ("num_hosts", "num_workers_per_host", "min_workers", "max_workers", "reset_limit",
                "cooldown_range", "elastic_timeout", "override_discovery", "cpus_per_slot", "gpus_per_slot")


class RayExecutor:
    """A ringlet job of ``num_workers`` Ray actors, each with ``cpus_per_worker`` CPUs and, with
    ``use_gpu``, ``gpus_per_worker`` GPUs (default 1).

    ``settings``: from :meth:`create_settings` (None: its defaults). Raises ``ValueError`` at once for a
    bad count, and from :meth:`start` when the Ray cluster does not have the resources (``use_gpu=True``
    on a cluster without GPUs included) rather than waiting for them. Horovod's elastic and per-host
    arguments raise ``NotImplementedError``.
    """

    create_settings = staticmethod(RaySettings.create)

    def __init__(self, settings: RaySettings | None = None, num_workers: int | None = None,
                 cpus_per_worker: float = 1, use_gpu: bool = False, gpus_per_worker: float | None = None,
                 use_current_placement_group: bool = True, **horovod_only):
        unknown = sorted(k for k, v in horovod_only.items() if v is not None)
        if unknown:
            offered = [k for k in unknown if k in _NOT_OFFERED]
            if offered:
                raise NotImplementedError(f"ringlet's RayExecutor does not offer {', '.join(offered)}: give "
                                          "num_workers (elastic Ray jobs are not supported).")
            raise TypeError(f"RayExecutor got unexpected arguments: {', '.join(unknown)}")
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive integer, not {num_workers!r}.")
        if not cpus_per_worker > 0:
            raise ValueError(f"cpus_per_worker must be > 0, not {cpus_per_worker!r}.")
        if gpus_per_worker is not None and not use_gpu:
            raise ValueError("gpus_per_worker needs use_gpu=True.")
        gpus = (1 if gpus_per_worker is None else gpus_per_worker) if use_gpu else 0
        if use_gpu and not gpus > 0:
            raise ValueError(f"gpus_per_worker must be > 0, not {gpus_per_worker!r}.")
        self.settings = settings if settings is not None else RaySettings()
        self.num_workers, self.cpus_per_worker = num_workers, cpus_per_worker
        self.use_gpu, self.gpus_per_worker = bool(use_gpu), gpus
        self.workers: list = []  # the actors, in rank order
        self.hosts: list[str] = []  # each rank's host (its node's address)
        self._store: JobStore | None = None
        self._broken: str | None = None

    # ---- start and stop -----------------------------------------------------------------------
    def start(self, executor_fn=None, extra_env_vars: dict | None = None) -> None:
        """Place the workers, give each its rank's environment (``extra_env_vars`` added to every
        worker's), then run ``executor_fn(worker)`` on each when given. Connects to Ray (``ray.init()``)
        when this process has not. Raises ``TimeoutError`` when the workers are not placed and answering
        within the settings' ``timeout_s``."""
        if self.workers:
            raise RuntimeError("This RayExecutor is already started; shutdown() it first.")
        ray = import_ray()
        if not ray.is_initialized():
            ray.init()
        self._check_resources(ray)
        actor = ray.remote(RingletWorker).options(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker)
        actors = [actor.remote() for _ in range(self.num_workers)]
        try:
            infos = self._get(ray, [a.describe.remote() for a in actors], "start")
            order, hosts = rank_order(infos)
            self.workers = [actors[i] for i in order]
            self.hosts = [h for h, n in hosts for _ in range(n)]
            self._store = JobStore(ray.util.get_node_ip_address())
            extra = {**self.settings.worker_env(), **{str(k): str(v) for k, v in (extra_env_vars or {}).items()}}
            self._get(ray, [w.update_env.remote({**self._store.env(r, hosts), **extra})
                            for r, w in enumerate(self.workers)], "start")
        except BaseException:
            self.workers = actors
            self.shutdown()
            raise
        self._broken = None
        if executor_fn is not None:
            self.execute(executor_fn)

    def _check_resources(self, ray) -> None:
        from ray.util.client import ray as client

        if client.is_connected():
            raise RuntimeError("ringlet's RayExecutor hosts the job's store in the driver: run the driver on a "
                               "node of the Ray cluster (ray.init(address='auto')), not through Ray Client.")
        have = ray.cluster_resources()
        needs = {"CPU": self.num_workers * self.cpus_per_worker, "GPU": self.num_workers * self.gpus_per_worker}
        for kind, need in needs.items():
            if need and have.get(kind, 0) < need:
                hint = " (use_gpu=True, but this Ray cluster has no GPUs)" if kind == "GPU" and not have.get(
                    "GPU") else ""
                raise ValueError(f"RayExecutor needs {need:g} {kind}s for {self.num_workers} workers but the Ray "
                                 f"cluster has {have.get(kind, 0):g}{hint}.")

    def _get(self, ray, refs, what: str):
        try:
            return ray.get(refs, timeout=self.settings.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"RayExecutor.{what}: the {self.num_workers} workers did not answer within "
                               f"timeout_s={self.settings.timeout_s:g} s (not placed: the cluster's free "
                               "resources, `ray status`).") from None

    def shutdown(self) -> None:
        """End the workers' actors and the job's store. ``start`` may follow."""
        if self.workers:
            ray = import_ray()
            for w in self.workers:
                try:
                    ray.kill(w)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        self.workers, self.hosts = [], []
        if self._store is not None:
            self._store.close()
            self._store = None

    # ---- running functions ---------------------------------------------------------------------
    def run_remote(self, fn, args=None, kwargs=None) -> list:
        """Start ``fn(*args, **kwargs)`` on every worker; the Ray object references, in rank order."""
        self._ready()
        return [w.run.remote(fn, args, kwargs) for w in self.workers]

    def run(self, fn, args=None, kwargs=None) -> list:
        """``fn(*args, **kwargs)`` on every worker; each one's return value, in rank order.

        When a worker fails, raises what failed first: the exception its ``fn`` raised, or (a worker that
        died) the survivors' ``PeerError`` naming its rank. The job cannot run again after that:
        ``shutdown()`` and ``start()``."""
        return self._gather(self.run_remote(fn, args, kwargs))

    def execute(self, fn) -> list:
        """``fn(worker)`` on every worker (a :class:`~.worker.RingletWorker`); the results in rank order."""
        self._ready()
        return self._gather([w.execute.remote(fn) for w in self.workers])

    def execute_single(self, fn):
        """``fn(worker)`` on rank 0's worker only; its result."""
        self._ready()
        return self._gather([self.workers[0].execute.remote(fn)])[0]

    def _ready(self) -> None:
        if not self.workers:
            raise RuntimeError("RayExecutor is not started: call start() first.")
        if self._broken:
            raise RuntimeError(f"RayExecutor's job failed ({self._broken}); shutdown() and start() it again.")

    def _gather(self, refs) -> list:
        def tell_others(rank: int, host: str, reason: str) -> None:
            self._broken = f"rank {rank} {reason}"
            self._store.record_failure(rank, host, reason)

        try:
            return Gather(import_ray(), refs, self.hosts, self.settings.timeout_s, tell_others).wait()
        except BaseException:
            self._broken = self._broken or "a worker failed"
            raise

    def __enter__(self) -> "RayExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

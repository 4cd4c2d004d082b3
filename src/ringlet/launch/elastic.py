"""The supervisor behind ``ringlet run --elastic``: workers come and go, the job goes on.

::

    ringlet run --elastic -np 4 --min-np 2 --restarts 2 -- python train.py

It hosts the job's store on 127.0.0.1 (the rendezvous, see :mod:`ringlet.elastic.protocol`; only holders
of the job's secret may use it), starts every worker through the per-rank shim (signals, orphan protection, ``RINGLET_*``/``HOROVOD_*`` env), and
decides the membership of each *generation*:

- a member dies (non-zero exit): if ``--restarts`` remain, a replacement starts (it joins later, see
  below); the next generation is the surviving members in their old rank order (old rank 0 stays
  rank 0), topped up with waiting newcomers when survivors alone are fewer than ``--min-np``. With
  fewer than ``--min-np`` workers left the job fails with the status of the first failure, as a
  non-elastic run would. Survivors learn it from their failed collective (Gloo closes the dead
  peer's connections) and rejoin through :mod:`.rendezvous`.
- a member asks for a newer generation (its collective failed for another reason, or every member
  raised ``HostsUpdatedInterrupt`` at a commit): the next generation is the live members plus the
  newcomers waiting (at most ``--max-np``).
- a newcomer registers: ``updates/<g>`` is set, so the members raise ``HostsUpdatedInterrupt`` at
  their next ``state.commit()`` and ask for the generation that includes it.
- a generation does not assemble within ``--elastic-timeout`` seconds: the members that never came
  are killed (counted as failures), which starts a newer generation. This is the last resort
  against a worker stuck forever; nothing waits without a bound.

The job succeeds when every member of the current generation has exited 0; newcomers still waiting
then are stopped.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from ..elastic import protocol as P
from ..liveness import keys as LK
from ..liveness.verdict import Verdict, exit_reason
from ..security.secret import SECRET_ENV
from ..store import StoreClient, StoreServer
from .config import SHIM, RunConfig
from .env import worker_env
from .hosts import LOOPBACK
from .status import Forwarder, exit_status

POLL_SECONDS = 0.05
SETTLE_SECONDS = 0.2  # after a member's request: let the exit of a peer that just died be seen first
STOP_GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class ElasticConfig:
    """Options of an elastic run (``ringlet run --elastic``)."""

    command: tuple[str, ...]
    np: int
    min_np: int
    max_np: int
    restarts: int = 0
    timeout: float = 600.0
    extra_env: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.command:
            raise ValueError("No command given: ringlet run --elastic -np N -- python train.py ...")
        if self.np < 1:
            raise ValueError("-np must be at least 1.")
        if not 1 <= self.min_np <= self.np:
            raise ValueError(f"--min-np must be between 1 and -np ({self.np}), got {self.min_np}.")
        if self.max_np < self.np:
            raise ValueError(f"--max-np must be at least -np ({self.np}), got {self.max_np}.")
        if self.restarts < 0:
            raise ValueError("--restarts cannot be negative.")
        if self.timeout <= 0:
            raise ValueError("--elastic-timeout must be positive.")


@dataclass
class _Worker:
    wid: str
    proc: subprocess.Popen
    status: int | None = None      # shell-style exit status once it exited
    request: int | None = None     # last value of req/<wid> seen
    rank: int | None = None        # rank in the generation it last belonged to

    @property
    def alive(self) -> bool:
        return self.status is None


class _Failed(Exception):
    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


def _say(msg: str) -> None:
    print(f"ringlet run: {msg}", file=sys.stderr, flush=True)


class Driver:
    """One elastic job on this host. :meth:`run` returns the job's exit status."""

    def __init__(self, cfg: ElasticConfig):
        self.cfg = cfg
        self.host = socket.gethostname()
        self.workers: dict[str, _Worker] = {}
        self.procs: list[subprocess.Popen] = []  # the signal forwarder walks this list
        self.members: list[str] = []
        self.gen = -1
        self.gen_started = 0.0
        self.assembled = False
        self.newcomers: list[str] = []           # registered, waiting for a generation
        self.restarts_left = cfg.restarts
        self.first_failure: tuple[_Worker, int] | None = None
        self.store = None
        self.server = None
        self.base_env: dict = {}
        self._next_id = 0

    # ---- processes ------------------------------------------------------------------------------
    def _env(self, wid: str, rank: int, size: int) -> dict:
        addr, port = LOOPBACK, str(self.server.port)
        return {**self.base_env, P.ENV_FLAG: "1", P.ENV_ADDR: addr, P.ENV_PORT: port, P.ENV_ID: wid,
                P.ENV_TIMEOUT: str(self.cfg.timeout), "MASTER_ADDR": addr, "MASTER_PORT": port,
                # Provisional place (the shim exports it); init() replaces it with the generation's.
                "RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(size)}

    def _spawn(self, rank: int, size: int) -> _Worker:
        wid = str(self._next_id)
        self._next_id += 1
        # A session of its own: only this driver forwards signals to it (no double Ctrl-C from the tty).
        proc = subprocess.Popen([sys.executable, *SHIM, *self.cfg.command], env=self._env(wid, rank, size),
                                start_new_session=True)
        w = self.workers[wid] = _Worker(wid, proc)
        self.procs.append(proc)
        return w

    def _reap(self) -> None:
        for w in list(self.workers.values()):
            if not w.alive:
                continue
            rc = w.proc.poll()
            if rc is None:
                continue
            w.status = exit_status(rc)
            if w.wid in self.newcomers:
                self.newcomers.remove(w.wid)
            if w.wid in self.members:
                if w.status != 0:
                    self._member_died(w)
            elif w.status != 0:
                _say(f"worker {w.wid} exited with status {w.status} before it joined; ignored.")

    def _member_died(self, w: _Worker) -> None:
        if self.first_failure is None:
            self.first_failure = (w, w.status)
        _say(f"worker {w.wid} (rank {w.rank} of generation {self.gen}) exited with status {w.status}.")
        death = Verdict(w.rank, self.host, exit_reason(w.status), time.time(), "dead")
        prefix = LK.session_prefix(LK.job_prefix({}), self.gen)
        self.store.set(LK.of_rank(prefix, LK.DEAD, w.rank), death.encode())
        self.store.append(LK.dead_list(prefix), f"{w.rank},")
        if self.restarts_left > 0:
            self.restarts_left -= 1
            nw = self._spawn(len(self.members) - 1, len(self.members))
            _say(f"started worker {nw.wid} to replace it ({self.restarts_left} restart(s) left).")
        self._new_generation(f"worker {w.wid} died")

    def _stop_all(self, sig: int | None = signal.SIGTERM) -> None:
        """Signal every live worker (``sig`` None: it already was), then SIGKILL what is left after a grace."""
        live = [w for w in self.workers.values() if w.alive and w.proc.poll() is None]
        for w in live:
            if sig is None:
                continue
            try:
                w.proc.send_signal(sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for w in live:
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()  # the shim's child dies with it (PR_SET_PDEATHSIG)
                w.proc.wait()

    # ---- generations ----------------------------------------------------------------------------
    def _publish(self, members: list[str], reason: str) -> None:
        self.gen += 1
        g = self.gen
        rec = P.Record(g, tuple(members), tuple(self.host for _ in members))
        self.store.set(P.gen_key(g), rec.encode())
        self.store.set(P.GEN, str(g))
        self.members = list(members)
        for r, wid in enumerate(members):
            self.workers[wid].rank = r
        self.newcomers = [n for n in self.newcomers if n not in members]
        self.gen_started = time.monotonic()
        self.assembled = False
        if g > 0:
            _say(f"generation {g}: {len(members)} rank(s) (workers {','.join(members)}) after {reason}.")
        if self.newcomers and len(members) < self.cfg.max_np:
            self.store.set(P.updates_key(g), "1")

    def _new_generation(self, reason: str) -> None:
        alive = [m for m in self.members if self.workers[m].alive]
        room = self.cfg.max_np - len(alive)
        members = alive + self.newcomers[:max(0, room)]
        if len(members) < self.cfg.min_np:
            # Replacements still starting count when they are needed to reach --min-np.
            starting = [w.wid for w in self.workers.values()
                        if w.alive and w.wid not in members and w.wid not in self.members and w.rank is None]
            members += starting[:max(0, self.cfg.max_np - len(members))]
        if len(members) < self.cfg.min_np:
            _say(f"{len(alive)} worker(s) left, fewer than --min-np {self.cfg.min_np}; stopping the job.")
            raise _Failed(self._failure_status())
        self._publish(members, reason)

    def _failure_status(self) -> int:
        if self.first_failure is None:
            return 1
        w, status = self.first_failure
        _say(f"worker {w.wid} (rank {w.rank}) failed first with exit status {status}; see its output above.")
        return status

    def _check_silence(self) -> None:
        """A member that the others' liveness monitors declared silent (a stopped or cut-off worker) is
        killed, so that the job goes on as after a crash."""
        key = LK.verdict(LK.session_prefix(LK.job_prefix({}), self.gen))
        if not self.store.check([key]):
            return
        v = Verdict.decode(self.store.get(key))
        if v.kind != "silent" or not 0 <= v.rank < len(self.members):
            return
        w = self.workers[self.members[v.rank]]
        if w.alive and w.proc.poll() is None:
            _say(f"worker {w.wid}: {v.describe()}; stopping it.")
            w.proc.kill()  # the shim's child dies with it (PR_SET_PDEATHSIG), stopped or not

    # ---- requests and assembly ------------------------------------------------------------------
    def _read_requests(self) -> None:
        bump = False
        for w in self.workers.values():
            key = P.request_key(w.wid)
            if not w.alive or not self.store.check([key]):
                continue
            v = int(self.store.get(key))
            if v == w.request:
                continue
            w.request = v
            if w.wid in self.members:
                bump = bump or v >= self.gen
            elif w.wid not in self.newcomers:
                self.newcomers.append(w.wid)
                _say(f"worker {w.wid} is ready to join; members take it in at their next commit.")
                if len(self.members) < self.cfg.max_np:
                    self.store.set(P.updates_key(self.gen), "1")
        if bump:
            g = self.gen
            time.sleep(SETTLE_SECONDS)
            self._reap()  # a death seen now already made a newer generation
            if self.gen == g:
                self._new_generation("a request from the members")

    def _check_assembly(self) -> None:
        if self.assembled:
            return
        n = self.store.add(P.arrived_key(self.gen), 0)
        if n >= len(self.members):
            self.assembled = True
            return
        if time.monotonic() - self.gen_started < self.cfg.timeout:
            return
        missing = [m for m in self.members if not self.store.check([P.arrived_marker(self.gen, m)])]
        if any(not self.workers[m].alive for m in missing):
            self._new_generation("members left before joining")
            return
        for m in missing:
            w = self.workers[m]
            _say(f"worker {m} did not join generation {self.gen} within {self.cfg.timeout:.0f}s; stopping it.")
            if w.alive:
                w.proc.kill()
        self.gen_started = time.monotonic()  # their exits (next _reap) start the next generation

    # ---- main loop ------------------------------------------------------------------------------
    def run(self) -> int:
        self.base_env = {k: v for k, v in os.environ.items() if k != "RINGLET_RUN_HOSTS"}
        self.base_env.update(worker_env(RunConfig(self.cfg.command, self.cfg.np, "torch",
                                                  extra_env=dict(self.cfg.extra_env)), None))
        # The workers are on this host: the store listens on loopback only, for holders of the job's secret.
        secret = bytes.fromhex(self.base_env[SECRET_ENV])
        self.server = StoreServer(LOOPBACK, 0, secret)
        self.store = StoreClient(LOOPBACK, self.server.port, secret, timeout=60.0)
        initial = [self._spawn(r, self.cfg.np) for r in range(self.cfg.np)]
        self._publish([w.wid for w in initial], "start")
        with Forwarder(self.procs) as fwd:
            try:
                while True:
                    if fwd.received is not None:
                        _say(f"got {signal.Signals(fwd.received).name}, stopped the workers.")
                        self._stop_all(None)  # the forwarder already passed the signal on
                        return 128 + int(fwd.received)
                    self._reap()
                    if not any(self.workers[m].alive for m in self.members):
                        return self._finish()
                    self._check_silence()
                    self._read_requests()
                    self._check_assembly()
                    time.sleep(POLL_SECONDS)
            except _Failed as exc:
                self.store.set(P.ABORT, "the job failed")
                self._stop_all()
                return exc.status
            finally:
                self._stop_all()

    def _finish(self) -> int:
        """Every member of the current generation has exited 0 (a failure would have moved on)."""
        self.store.set(P.ABORT, "the job finished")
        waiting = [w for w in self.workers.values() if w.alive]
        if waiting:
            _say(f"the job finished; stopping {len(waiting)} worker(s) that had not joined.")
        return 0


def run_elastic(cfg: ElasticConfig) -> int:
    """Run an elastic job (see the module docstring); return its exit status."""
    return Driver(cfg).run()

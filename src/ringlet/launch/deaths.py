"""The node agent's side of liveness: death records out, the job's culprit in.

Every rank's shim writes an exit record into the agent's run directory when its rank fails
(:mod:`.shim`). :class:`DeathWatch` publishes each one to the job's store as a death record
(:mod:`ringlet.liveness.keys`), where the survivors' monitors find it a moment after their connections
to the dead rank reset, so their ``PeerError`` names it. It also keeps the verdicts the monitors
publish (a rank that fell silent), so that the launcher can say which rank failed first once the job
has stopped, even when the failure was silence and not an exit.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from ..liveness import keys as K
from ..liveness.verdict import Verdict, exit_reason
from .config import say

POLL = 0.1  # seconds between scans of the run directory
_CASUALTIES = {exit_reason(128 + 15), exit_reason(128 + 2)}  # SIGTERM, SIGINT: how a launcher stops ranks
SESSIONS = 4  # ringlet.init sessions per job whose verdicts the launcher reads


class DeathWatch:
    """Publish this node's exit records; collect the job's verdicts. ``endpoint()`` returns the store's
    ``(addr, port)`` once the rendezvous has made it (None before)."""

    def __init__(self, run_dir: str, run_id: str, endpoint):
        self.run_dir = Path(run_dir)
        self.job = f"{K.ROOT}/{run_id}/0"
        self._endpoint = endpoint
        self._published: set[str] = set()
        self._verdicts: dict = {}  # session number or ("dead", rank) -> Verdict
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ringlet-deathwatch", daemon=True)
        self._store = None

    def start(self) -> "DeathWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def flush(self) -> None:
        """Publish the exit records written so far now (the agent is about to stop): the thread is
        paused for it, so the store client is used by one thread at a time."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        try:
            if self._store is not None or self._connect():
                self._publish()
                self._read_verdicts()
        except Exception:  # noqa: BLE001 - the store is gone; the launcher's own report remains
            pass

    def store(self):
        """The job's store client (after :meth:`flush`, for the agent's own last words), or None when the
        store cannot be reached."""
        try:
            if self._store is not None or self._connect():
                return self._store
        except Exception:  # noqa: BLE001 - the store is gone
            pass
        return None

    def _loop(self) -> None:
        last_read = 0.0
        while not self._stop.wait(POLL):
            try:
                if self._store is None and not self._connect():
                    continue
                self._publish()
                if time.monotonic() - last_read > 0.5:
                    self._read_verdicts()
                    last_read = time.monotonic()
            except Exception:  # noqa: BLE001 - the store went away with the job; nothing more to say
                self._store = None

    def _connect(self) -> bool:
        ep = self._endpoint()
        if ep is None:
            return False
        from ..store.torch_store import connect

        self._store = connect(ep[0], int(ep[1]), timeout=10.0, connect_timeout=10.0)
        return True

    def _publish(self) -> None:
        for p in sorted(self.run_dir.glob("exit-*.json")):
            if p.name in self._published:
                continue
            try:
                rec = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            self._published.add(p.name)
            v = Verdict(int(rec["rank"]), str(rec.get("host", "?")), exit_reason(int(rec["status"])),
                        float(rec["time"]), "dead")
            self._store.set(K.of_rank(self.job, K.DEAD, v.rank), v.encode())
            self._store.append(K.dead_list(self.job), f"{v.rank},")

    def _read_verdicts(self) -> None:
        dead = K.dead_list(self.job)
        if self._store.check([dead]):
            for r in {int(x) for x in self._store.get(dead).decode().split(",") if x.strip()}:
                if ("dead", r) not in self._verdicts:
                    self._verdicts[("dead", r)] = Verdict.decode(self._store.get(K.of_rank(self.job, K.DEAD, r)))
        for s in range(SESSIONS):
            if s in self._verdicts:
                continue
            key = K.verdict(K.session_prefix(self.job, s))
            if self._store.check([key]):
                self._verdicts[s] = Verdict.decode(self._store.get(key))

    def culprit(self) -> Verdict | None:
        """What happened first in the whole job: the earliest of the monitors' verdicts (a silent rank)
        and the death records of every host (ranks stopped by their launcher only if nothing else)."""
        found = list(self._verdicts.values())
        causes = [v for v in found if not (v.kind == "dead" and v.reason in _CASUALTIES)] or found
        return min(causes, key=lambda v: v.time) if causes else None

    def report(self) -> bool:
        """Say which rank failed first in the job, when the store told; False when it did not."""
        v = self.culprit()
        if v is not None:
            say(f"the first failure: {v.describe()}; the job was stopped.")
        return v is not None

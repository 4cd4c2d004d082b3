"""How a job ends: signals forwarded to the ranks, the rank that failed first, the launcher's status."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from .config import say


def exit_status(code: int) -> int:
    """A shell-style status: a negative returncode (killed by signal s) becomes 128 + s."""
    return code if code >= 0 else 128 - code


def root_cause(run_dir: str) -> dict | None:
    """The failure recorded first by the shims in ``run_dir`` (earliest exit time)."""
    recs = []
    for p in Path(run_dir).glob("exit-*.json"):
        try:
            recs.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    if not recs:
        return None
    # Ranks stopped by the launcher (SIGTERM/SIGINT) are casualties, not causes, if others failed. A
    # SIGKILL is a cause (the OOM killer, kill -9): the launcher sends one only long after its SIGTERM.
    casualties = {128 + signal.SIGTERM, 128 + signal.SIGINT}
    causes = [r for r in recs if r["status"] not in casualties] or recs
    return min(causes, key=lambda r: r["time"])


def report(rec: dict | None, fallback: int, nfailed: int | None = None, where: str = "") -> int:
    """Name the rank that failed first (``rec``, from :func:`root_cause`) and return its status; ``where``
    prefixes the sentence (``"on this host, "`` for one node launcher of several)."""
    if rec is None:
        say(f"the job failed with exit status {fallback}.")
        return fallback
    extra = f"; {nfailed - 1} other rank(s) failed after it" if nfailed and nfailed > 1 else ""
    say(f"{where}rank {rec['rank']} (host {rec['host']}) failed first with exit status {rec['status']}{extra}; "
        "see its output above.")
    return int(rec["status"])


class Forwarder:
    """Forward SIGINT/SIGTERM/SIGHUP to child processes while the launcher waits for them."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, procs):
        self.procs = procs
        self.received: int | None = None
        self._old = {}

    def __enter__(self):
        for s in self.SIGNALS:
            try:
                self._old[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, _frame):
        self.received = signum
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except ProcessLookupError:
                    pass

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)
        return False


STOP_GRACE = 10.0  # seconds the other hosts get to fail on their own (and say why) before they are stopped


def wait_all(procs, grace: float = STOP_GRACE) -> int:
    """Wait for the node launchers; the first one to fail decides the status. The rest get ``grace``
    seconds to end by themselves (their ranks raise the ``PeerError`` that names the failed rank), then
    they are stopped."""
    status, stop_at = 0, None
    with Forwarder(procs) as fwd:
        pending = list(procs)
        while pending:
            for p in list(pending):
                rc = p.poll()
                if rc is None:
                    continue
                pending.remove(p)
                if rc != 0 and status == 0:
                    status = exit_status(rc)
                    stop_at = time.monotonic() + grace
            if stop_at is not None and time.monotonic() >= stop_at:
                for q in pending:
                    q.terminate()
                stop_at = None
            time.sleep(0.05)
        if fwd.received is not None and status == 0:
            status = 128 + fwd.received
    return status

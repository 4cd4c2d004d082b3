"""The stall warning: names that some ranks announced long ago and other ranks never did (rank 0 logs it)."""
from __future__ import annotations

import logging
import time

log = logging.getLogger("ringlet.torch")


def _stalled(pending: dict, process_sets, joined: set[int], age: float, now: float):
    """``(name, process set id, entry, missing ranks)`` of each entry older than ``age`` seconds that
    misses ranks which have not joined."""
    for (ps_id, name), e in pending.items():
        if now - e.first < age:
            continue
        try:
            ranks = process_sets.group(ps_id).ranks
        except ValueError:
            continue
        missing = [r for r in ranks if r not in e.metas and r not in joined]
        if missing:
            yield name, ps_id, e, missing


def stall_check(pending: dict, process_sets, joined: set[int], stall: float) -> None:
    """Warn about entries of ``pending`` (the negotiation table) older than ``stall`` seconds that miss
    ranks which have not joined; each entry is reported again at most every ``stall`` seconds."""
    now = time.monotonic()
    lines = []
    for name, ps_id, e, missing in _stalled(pending, process_sets, joined, stall, now):
        if e.warned and now - e.warned < stall:
            continue
        e.warned = now
        lines.append(f"{name} (process set {ps_id}): missing ranks {missing}, submitted by ranks {sorted(e.metas)}")
    if lines:
        log.warning("Stall: %d op(s) were submitted by some ranks but not by others for more than %.0f s. "
                    "This may mean ranks submit different names, or only some ranks submit them "
                    "(which deadlocks):\n  %s", len(lines), stall, "\n  ".join(lines))


def stalled_beyond(pending: dict, process_sets, joined: set[int], limit: float) -> str | None:
    """The error message when an entry of ``pending`` has missed ranks (not joined) for more than
    ``limit`` seconds, else None (``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``)."""
    for name, ps_id, e, missing in _stalled(pending, process_sets, joined, limit, time.monotonic()):
        return (f"Stalled for more than {limit:g} s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): {name} (process "
                f"set {ps_id}) was submitted by ranks {sorted(e.metas)} but never by ranks {missing} "
                "(different names, or an op only some ranks submit); shutting down.")
    return None

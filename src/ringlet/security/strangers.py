"""Refused connections, reported once per (endpoint, address) so that a port scan cannot flood the log."""
from __future__ import annotations

import logging
import sys
import threading

log = logging.getLogger("ringlet.security")
_seen: set[tuple[str, str]] = set()
_lock = threading.Lock()


def note_stranger(endpoint: str, address, why: str) -> bool:
    """Report that ``endpoint`` (e.g. ``"store"``) refused a connection from ``address`` because ``why``.

    The first refusal per (endpoint, host) is logged as a warning (on stderr when logging is not
    configured); later ones are not. Returns True when this call reported."""
    host = address[0] if isinstance(address, (tuple, list)) and address else str(address)
    key = (endpoint, str(host))
    with _lock:
        if key in _seen:
            return False
        _seen.add(key)
    msg = f"ringlet: {endpoint} refused a connection from {address}: {why}"
    if log.hasHandlers():
        log.warning(msg)
    else:
        print(msg, file=sys.stderr, flush=True)
    return True


def reset() -> None:
    """Forget which strangers were reported (tests)."""
    with _lock:
        _seen.clear()

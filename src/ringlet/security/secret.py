"""The job's secret and the HMAC that proves knowledge of it.

``ringlet run`` draws 32 random bytes per job and gives them to every node launcher and rank as the
hexadecimal value of :data:`SECRET_ENV`: through the environment of local processes and through the
standard input of remote ones, never on a command line and never in a log. A process proves it holds
the secret by answering a fresh random challenge with ``HMAC-SHA256(secret, role || challenge)``;
the role label keeps an answer given in one direction or protocol from being replayed in another.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets

SECRET_ENV = "RINGLET_JOB_SECRET"
SECRET_BYTES = 32
NONCE_BYTES = 16
MAC_BYTES = hashlib.sha256().digest_size


def new_secret() -> str:
    """A fresh job secret, as the hexadecimal text :data:`SECRET_ENV` carries."""
    return secrets.token_hex(SECRET_BYTES)


def job_secret(environ=None) -> bytes | None:
    """The job's secret from ``environ`` (default ``os.environ``), or None when the job has none.

    Raises ``ValueError`` when the variable is set but is not the hexadecimal text of at least 16 bytes
    (a truncated or hand-typed secret must not silently weaken the job)."""
    text = (os.environ if environ is None else environ).get(SECRET_ENV, "").strip()
    if not text:
        return None
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{SECRET_ENV} is not hexadecimal text.") from None
    if len(raw) < 16:
        raise ValueError(f"{SECRET_ENV} holds {len(raw)} bytes; at least 16 are needed.")
    return raw


def new_nonce() -> bytes:
    """A fresh random challenge."""
    return secrets.token_bytes(NONCE_BYTES)


def prove(secret: bytes, role: bytes, *parts: bytes) -> bytes:
    """``HMAC-SHA256(secret, role || len-prefixed parts)``: the answer to a challenge made of ``parts``."""
    mac = hmac.new(secret, role, hashlib.sha256)
    for p in parts:
        mac.update(len(p).to_bytes(4, "big"))
        mac.update(p)
    return mac.digest()


def verify(secret: bytes, answer: bytes, role: bytes, *parts: bytes) -> bool:
    """True when ``answer`` is :func:`prove` of the same inputs (compared in constant time)."""
    return hmac.compare_digest(answer, prove(secret, role, *parts))

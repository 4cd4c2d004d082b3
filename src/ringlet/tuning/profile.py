"""A calibration profile: the network constants measured on one cluster, keyed by its fingerprint.

Saved as JSON (``ringlet tune`` writes one; ``ringlet.init()`` loads a matching one; ``ringlet
simulate --from-profile`` uses one as its network). A profile applies to a job only when the
fingerprint matches: same rank count, same ranks per host in the same order, same transport.

Profiles are cached per user in :func:`profile_dir` (``RINGLET_PROFILE_DIR``, else
``$XDG_CACHE_HOME/ringlet/profiles``, else ``~/.cache/ringlet/profiles``), one file per fingerprint,
named ``<fingerprint.key>.json`` (:func:`cache_path`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import Sequence

from .network import Network, host_layout

FORMAT = 1
log = logging.getLogger("ringlet.tuning")


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What a profile is valid for: ``ranks``, ``layout`` (ranks per host, hosts in rank order), ``transport``."""

    ranks: int
    layout: tuple[int, ...]
    transport: str

    @staticmethod
    def of(host_of: Sequence[int], transport: str) -> "Fingerprint":
        return Fingerprint(len(host_of), host_layout(host_of), str(transport))

    @property
    def key(self) -> str:
        """A short stable digest, usable in file names."""
        text = f"{self.ranks}|{','.join(map(str, self.layout))}|{self.transport}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def host_of(self) -> tuple[int, ...]:
        """Host index of every rank, from the layout."""
        return tuple(h for h, n in enumerate(self.layout) for _ in range(n))

    def to_dict(self) -> dict:
        return {"ranks": self.ranks, "layout": list(self.layout), "transport": self.transport, "key": self.key}

    def describe(self) -> str:
        hosts = len(self.layout)
        shape = f"{hosts} hosts × {self.layout[0]}" if len(set(self.layout)) == 1 else f"hosts {list(self.layout)}"
        return f"{self.ranks} ranks ({shape}) over {self.transport}"


@dataclass(frozen=True)
class Profile:
    """Measured ``network`` for the cluster ``fingerprint``; ``info`` holds free-form details of the
    measurement (date, samples, fit residuals) for reports."""

    fingerprint: Fingerprint
    network: Network
    info: dict = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "fingerprint": self.fingerprint.to_dict(), "network": self.network.to_dict(),
                "info": self.info}

    @staticmethod
    def from_dict(d: dict) -> "Profile":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"not a ringlet calibration profile (format {FORMAT}): {str(d)[:80]!r}")
        try:
            f = d["fingerprint"]
            fp = Fingerprint(int(f["ranks"]), tuple(int(x) for x in f["layout"]), str(f["transport"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"calibration profile has a bad fingerprint: {d.get('fingerprint')!r}") from exc
        if sum(fp.layout) != fp.ranks:
            raise ValueError(f"calibration profile layout {list(fp.layout)} does not add up to {fp.ranks} ranks")
        if not isinstance(d.get("network"), dict):
            raise ValueError(f"calibration profile has no network table: {str(d.get('network'))[:80]!r}")
        info = d.get("info", {})
        return Profile(fp, Network.from_dict(d["network"]), dict(info) if isinstance(info, dict) else {})

    def save(self, path: str) -> None:
        """Write atomically (temp file + rename)."""
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".profile-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.to_dict(), fh, indent=2, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @staticmethod
    def load(path: str) -> "Profile":
        """Read a profile; ``ValueError`` naming the file when it is not one (``OSError`` when it cannot
        be read)."""
        with open(path, "rb") as fh:
            return Profile.loads(fh.read(), path)

    @staticmethod
    def loads(data: bytes | str, source: str) -> "Profile":
        """Parse a profile's JSON text; ``ValueError`` naming ``source`` when it is not one."""
        try:
            return Profile.from_dict(json.loads(data))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source} is not JSON: {exc}") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{source}: {exc}") from None


def profile_dir() -> str:
    """The per-user profile cache: ``RINGLET_PROFILE_DIR``, else ``$XDG_CACHE_HOME/ringlet/profiles``,
    else ``~/.cache/ringlet/profiles`` (not created here)."""
    explicit = os.environ.get("RINGLET_PROFILE_DIR", "").strip()
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "ringlet", "profiles")


def cache_path(fp: Fingerprint, folder: str | None = None) -> str:
    """Where the profile of ``fp`` lives in ``folder`` (default :func:`profile_dir`)."""
    return os.path.join(folder or profile_dir(), f"{fp.key}.json")


def lookup(fp: Fingerprint, folder: str | None = None) -> Profile | None:
    """The cached profile of ``fp`` in ``folder`` (default :func:`profile_dir`), or ``None`` when there is
    none or the file there holds another fingerprint's profile (a hand-copied file; ignored with a log
    line). A file that is not a profile raises ``ValueError`` naming it."""
    path = cache_path(fp, folder)
    if not os.path.exists(path):
        return None
    prof = Profile.load(path)
    if prof.fingerprint != fp:
        log.warning("ringlet: ignoring %s: it holds the profile of %s, not of %s", path,
                    prof.fingerprint.describe(), fp.describe())
        return None
    return prof

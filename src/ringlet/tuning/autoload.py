"""The network model of a starting job: the calibration profile that matches it, found at ``init``.

:func:`attach` sets ``rt.profile`` (the :class:`~ringlet.tuning.profile.Profile` or ``None``),
``rt.network_model`` (``(network, topology)`` or ``None``) and ``rt.selector`` (the algorithm selector
the runtime hands the engine) on every rank, from ``rt.options``:

- ``tune="off"``: nothing is read; both stay ``None``.
- ``tune="load"`` (default): the profile at ``options.profile`` (``RINGLET_PROFILE``) if given, else the
  one cached for the job's fingerprint (:func:`~ringlet.tuning.profile.cache_path`). A profile made for
  another fingerprint (rank count, host layout, transport) is ignored with a log line; a file that is
  not a profile, or an explicit path that cannot be read (missing included), raises ``ValueError``
  naming it, on every rank.
- ``tune="auto"``: as ``load``; when no matching profile is found, a quick calibration
  (:func:`~ringlet.tuning.calibrate.calibrate`, plan ``quick``) runs and rank 0 saves its profile (to the
  explicit path when that file did not exist, else to the cache).

With a profile, the runtime's selector takes its network as the cost model
(:class:`ringlet.tuning.select.Selector`): ``algorithm="auto"`` then picks algorithm and segment size
from it; without one the selector follows the size rule.

Rank 0 reads the file and broadcasts its bytes (through the prober it is handed,
:class:`ringlet.engine.probe.Prober`, which also runs a calibration); every rank parses the same bytes,
so every rank holds the same numbers or raises the same error. A collective: every rank calls it with the same options.
"""
from __future__ import annotations

import json
import logging
import os

from .calibrate import calibrate
from .model import Model, segments_up_to
from .network import Topology
from .profile import Fingerprint, Profile, cache_path
from .select import Selector

log = logging.getLogger("ringlet.tuning")


def _read(path: str, explicit: bool) -> bytes:
    """Rank 0's envelope: empty when the file does not exist (and was not asked for by name), else JSON
    with the file's text or the reason it could not be read."""
    if not os.path.exists(path) and not explicit:
        return b""
    try:
        with open(path, "rb") as fh:
            return json.dumps({"data": fh.read().decode("utf-8", errors="replace")}).encode()
    except OSError as exc:
        return json.dumps({"error": f"{type(exc).__name__}: {exc.strerror or exc}"}).encode()


def _parse(envelope: bytes, source: str, fp: Fingerprint, missing_ok: bool, rank: int) -> Profile | None:
    """The matching profile in ``envelope`` (identical on every rank), ``None``, or the same error everywhere."""
    if not envelope:
        return None
    got = json.loads(envelope)
    if "error" in got:
        if missing_ok and got["error"].startswith("FileNotFoundError"):
            return None
        raise ValueError(f"{source} cannot be read: {got['error']}")
    prof = Profile.loads(got["data"], source)
    if prof.fingerprint != fp:
        if rank == 0:
            log.warning("ringlet: ignoring %s: it was made for %s, this job is %s",
                        source, prof.fingerprint.describe(), fp.describe())
        return None
    return prof


def _save(prof: Profile, path: str) -> None:
    try:
        prof.save(path)
        log.info("ringlet: saved calibration profile %s", path)
    except OSError as exc:
        log.warning("ringlet: could not save calibration profile %s: %s", path, exc)


def attach(rt, prober) -> Profile | None:
    """Find (or, with ``tune="auto"``, make) the profile of ``rt``'s job and set ``rt.profile``,
    ``rt.network_model`` and ``rt.selector`` on every rank; return the profile. ``prober``: a
    :class:`ringlet.engine.probe.Prober` of ``rt``. Errors: see the module docstring."""
    rt.profile, rt.network_model, rt.selector = None, None, Selector()
    mode = rt.options.tune
    if mode == "off":
        return None
    fp = Fingerprint.of(rt.world.host_of, rt.transport.name)
    explicit = rt.options.profile
    path = os.path.abspath(os.path.expanduser(explicit)) if explicit else cache_path(fp)
    envelope = prober.broadcast_bytes(_read(path, bool(explicit)) if rt.rank == 0 else None)
    source = f"calibration profile {path}" + (" (RINGLET_PROFILE)" if explicit else "")
    prof = _parse(envelope, source, fp, missing_ok=(mode == "auto"), rank=rt.rank)
    if prof is None and mode == "auto":
        prof = calibrate(prober, "quick")
        path = path if explicit and not _had_file(envelope) else cache_path(fp)
        if rt.rank == 0:
            _save(prof, path)
    if prof is not None:
        rt.profile, rt.network_model = prof, (prof.network, Topology(tuple(rt.world.host_of)))
        # "auto" now follows the cost model on every rank, among the segments the transport runs
        segments = segments_up_to(rt.transport.capabilities.max_segment_bytes)
        rt.selector = Selector(Model(prof.network, segments=segments))
        if rt.rank == 0:
            log.info("ringlet: network model of %s from %s", fp.describe(), path)
    return prof


def _had_file(envelope: bytes) -> bool:
    """True when rank 0 found a readable file (``envelope`` from :func:`_read`)."""
    return bool(envelope) and "data" in json.loads(envelope)

"""Where a single-host job's flight records go (:mod:`ringlet.flight`), and what the launcher says of them.

Unless ``RINGLET_FLIGHT_DIR`` is already set, ``ringlet run`` gives each job a folder of its own under the
system temp dir and exports it to every rank. When the job succeeds the folder is removed; when it fails it
is kept, and the launcher prints where it is and the one-sentence verdict of ``ringlet diagnose`` on it
(:func:`ringlet.diagnose.analyse`). Jobs with ranks on other hosts (``--hosts``, ``--cluster``) leave the
default (each rank's own temp dir): their records are not collected by the launcher yet.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Callable

FLIGHT_ENV = "RINGLET_FLIGHT_DIR"


def with_flight_dir(env: dict, launch: Callable[[dict], int]) -> int:
    """Run ``launch(env)`` with the job's flight folder in ``env`` (see the module docstring); its status."""
    if os.environ.get(FLIGHT_ENV) or env.get(FLIGHT_ENV):
        return launch(env)
    folder = tempfile.mkdtemp(prefix="ringlet-flight-")
    try:
        status = launch({**env, FLIGHT_ENV: folder})
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if status == 0:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        _report(folder)
    return status


def _report(folder: str) -> None:
    from ..diagnose import analyse, load

    try:
        verdict = analyse(load(folder)).sentence
    except ValueError as exc:  # no readable record: the ranks died before writing one
        verdict = str(exc)
    print(f"ringlet run: flight records in {folder} (ringlet diagnose {folder}): {verdict}", file=sys.stderr)

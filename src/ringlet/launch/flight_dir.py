"""Where a single-host job's flight records go (:mod:`ringlet.flight`), and what the launcher says of them.

Unless ``RINGLET_FLIGHT_DIR`` is already set, ``ringlet run`` gives each job a folder of its own under the
system temp dir and exports it to every rank. When the job succeeds the folder is removed; when it fails it
is kept, and the launcher prints where it is and the one-sentence verdict of ``ringlet diagnose`` on it
(:func:`ringlet.diagnose.analyse`). Jobs with ranks on several hosts (``--hosts``, ``--cluster``) collect
their records through the job's store instead (:mod:`.flight_collect`).
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
        report(folder)
    return status


def report(folder: str) -> None:
    """Print where the job's flight records are and the one-sentence verdict on them."""
    from ..diagnose import analyse, load

    try:
        verdict = analyse(load(folder)).sentence
    except ValueError as exc:  # no readable record: the ranks died before writing one
        verdict = str(exc)
    print(f"ringlet run: flight records in {folder} (ringlet diagnose {folder}): {verdict}", file=sys.stderr)

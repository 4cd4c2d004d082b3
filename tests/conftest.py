"""Every test starts from no calibration profile: a developer's ``ringlet tune`` cache (or a
``RINGLET_PROFILE`` in the shell) would otherwise install a cost model in the test jobs and change
what ``algorithm="auto"`` runs. Tests of profiles set these variables themselves.

The run gets a temp folder of its own (``TMPDIR``, inherited by every job it starts), removed when the run
ends: the flight records that failing jobs keep on purpose, and other scratch, do not pile up in /tmp.

tests/workers holds the scripts the tests launch as processes and the helpers they import (on sys.path
through pyproject's ``pythonpath``); nothing there is collected as a test."""
from __future__ import annotations

import os
import shutil
import tempfile

collect_ignore = ["workers"]


_OWN_TMP = "RINGLET_TEST_TMPDIR"  # set by the process that made the run's temp folder (xdist workers inherit it)


def pytest_configure(config) -> None:
    if not os.environ.get(_OWN_TMP):
        os.environ[_OWN_TMP] = os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="ringlet-tests-")
        tempfile.tempdir = None  # later calls read TMPDIR again
        config._ringlet_tmp = os.environ[_OWN_TMP]
    os.environ["RINGLET_PROFILE_DIR"] = tempfile.mkdtemp(prefix="ringlet-test-profiles-")
    os.environ.pop("RINGLET_PROFILE", None)
    os.environ.pop("RINGLET_TUNE", None)



def pytest_unconfigure(config) -> None:
    own = getattr(config, "_ringlet_tmp", None)
    if own:
        shutil.rmtree(own, ignore_errors=True)

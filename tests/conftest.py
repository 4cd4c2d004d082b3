"""Every test starts from no calibration profile: a developer's ``ringlet tune`` cache (or a
``RINGLET_PROFILE`` in the shell) would otherwise install a cost model in the test jobs and change
what ``algorithm="auto"`` runs. Tests of profiles set these variables themselves.

tests/workers holds the scripts the tests launch as processes and the helpers they import (on sys.path
through pyproject's ``pythonpath``); nothing there is collected as a test."""
from __future__ import annotations

import os
import tempfile

collect_ignore = ["workers"]


def pytest_configure(config) -> None:
    os.environ["RINGLET_PROFILE_DIR"] = tempfile.mkdtemp(prefix="ringlet-test-profiles-")
    os.environ.pop("RINGLET_PROFILE", None)
    os.environ.pop("RINGLET_TUNE", None)


"""Every test starts from no calibration profile: a developer's ``ringlet tune`` cache (or a
``RINGLET_PROFILE`` in the shell) would otherwise install a cost model in the test jobs and change
what ``algorithm="auto"`` runs. Tests of profiles set these variables themselves.

``make test`` runs two pytest-xdist workers (``-n 2 --dist loadgroup``): the real-process tests
(tests/multiproc) share one group, so they run one at a time on one worker (each job already keeps
the cores busy while it starts its ranks), beside the in-process tests, which hold one core each.

tests/workers holds the scripts the tests launch as processes and the helpers they import (on sys.path
through pyproject's ``pythonpath``); nothing there is collected as a test."""
from __future__ import annotations

import os
import tempfile

import pytest

collect_ignore = ["workers"]


def pytest_configure(config) -> None:
    os.environ["RINGLET_PROFILE_DIR"] = tempfile.mkdtemp(prefix="ringlet-test-profiles-")
    os.environ.pop("RINGLET_PROFILE", None)
    os.environ.pop("RINGLET_TUNE", None)


def pytest_collection_modifyitems(config, items) -> None:
    """Real-process tests in one xdist group: never two jobs at once (no effect without xdist)."""
    for item in items:
        if "multiproc" in item.path.parts:
            item.add_marker(pytest.mark.xdist_group("processes"))

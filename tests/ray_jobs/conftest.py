"""One local Ray instance (an in-process head with 4 CPUs) shared by the Ray tests; every test here is
skipped, with the reason, when the ``ray`` package is not installed (``make test-ray`` installs it)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))  # ray_digits, for the tests themselves
NO_RAY = "the `ray` package is not installed: `make test-ray` installs it (pip install 'ringlet[ray]')"


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.ray)


@pytest.fixture(scope="session")
def ray_cluster():
    """``ray.init(num_cpus=4)``; the workers import this folder's helpers, ringlet and the examples."""
    ray = pytest.importorskip("ray", reason=NO_RAY)
    paths = [str(ROOT / "src"), str(Path(__file__).parent), str(ROOT / "examples")]
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([old] if old else []))  # the raylet's workers inherit it
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=4, include_dashboard=False, _temp_dir="/tmp/ringlet-ray")
    yield ray
    ray.shutdown()

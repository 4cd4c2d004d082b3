"""The fuzz with real processes: 3 and 4 ranks over Gloo (``--transport torch``) and shared memory run
the same generated cases (tests/workers/fuzz_cases.py, fuzz_hvd.py) from a seed every rank shares; cases
with faults make ranks differ on purpose. Every rank ends every case with the reference or a clear
exception, and the job finishes within the test's bound (the worker: ``fuzz_worker.py``).

By default one short job per transport runs (``SMOKE_CASES``); the full campaign over both transports
and both world sizes is marked ``slow`` (``make test-slow``).

``RINGLET_FUZZ_EXAMPLES`` multiplies the number of cases, ``RINGLET_FUZZ_SEED`` picks another seed."""
from __future__ import annotations

import os
import sys

import pytest
from mp_jobs import job_report, load_rank_files, require_transport, run_job, worker

SCALE = max(1, int(os.environ.get("RINGLET_FUZZ_EXAMPLES", "1") or "1"))
SEED = int(os.environ.get("RINGLET_FUZZ_SEED", "20") or "20")
CASES = 30 * SCALE
SMOKE_CASES = 10
CHUNK = 20  # cases per job (at most 28 groups: see the test)
OP_TIMEOUT = "5"  # seconds: a rank left waiting by one that sat out or failed locally raises after this


def _run_chunk(transport: str, world: int, seed: int, first: int, count: int, out) -> list[dict]:
    env = {"RINGLET_TIMEOUT": OP_TIMEOUT, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": OP_TIMEOUT,
           "RINGLET_TUNE": "off"}
    job = run_job(["-np", str(world), "--transport", transport, "--", sys.executable, worker("fuzz_worker.py"),
                   str(out), str(seed), str(first), str(count)], timeout=120 + 12 * count, env=env)
    ranks = load_rank_files(out, world)
    missing = [r for r, s in enumerate(ranks) if s is None or not s["done"]]
    assert not missing, f"ranks {missing} did not finish every case\n{job_report(job)}"
    problems = [f"case {c['i']} ({c.get('kind')}, faults {c.get('faults')}): {p}\n  {c.get('case', '')[:600]}"
                for s in ranks for c in s["cases"] for p in c["problems"]]
    assert not problems, "\n".join(problems[:20])
    assert job.returncode == 0, job_report(job)
    return ranks[0]["cases"]


def _grid() -> list:
    smoke = [pytest.param("torch", 3, SMOKE_CASES, id="torch-3-smoke"),
             pytest.param("shm", 4, SMOKE_CASES, id="shm-4-smoke")]
    full = [pytest.param(t, w, CASES, id=f"{t}-{w}-full", marks=pytest.mark.slow)
            for t in ("torch", "shm") for w in (3, 4)]
    return smoke + full


@pytest.mark.multiproc
@pytest.mark.parametrize("transport,world,count", _grid())
def test_fuzz_real_processes(transport, world, count, tmp_path):
    """The cases run in jobs of ``CHUNK``: a core case with faults or a sub-group makes one group, a
    Horovod case (every third) two, and groups have 31 slots in the message tags (docs/usage.md), so one
    job must not make 31 over the same ranks."""
    require_transport(transport)
    seed = SEED * 10 + world
    cases = []
    for first in range(0, count, CHUNK):
        cases += _run_chunk(transport, world, seed, first, min(CHUNK, count - first), tmp_path / f"fuzz{first}.json")
    clean = sum(c["clean"] for c in cases)
    print(f"{transport} x {world}, seed {seed}: {count} cases, {clean} clean, {count - clean} with faults; "
          f"{sum(c['seconds'] for c in cases):.1f} s")

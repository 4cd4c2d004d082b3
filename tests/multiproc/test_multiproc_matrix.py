"""The collective matrix over real transports: one ``ringlet run`` job per (transport, world size), for a
few representative pairs (the schedules themselves are checked over every world size 1..8 in-process).

Each job runs every case inside one set of processes (see ``matrix_worker.py``); this test only
launches it, collects the per-rank summaries and fails with the list of failing cases.
"""
from __future__ import annotations

import sys

import pytest

from mp_jobs import job_report, load_rank_files, require_transport, run_job, transport_world_params, worker

JOB_TIMEOUT = 420  # seconds; a healthy job takes well under a minute here


# Shared memory (the default transport on one host) at every world size; Gloo and MPI at one or two.
MATRIX = transport_world_params(("shm", 2), ("shm", 3), ("shm", 4), ("torch", 3), ("torch", 4), ("mpi", 3))


@pytest.mark.multiproc
@pytest.mark.parametrize("transport,world", MATRIX)
def test_collective_matrix(transport, world, tmp_path):
    require_transport(transport)
    out = tmp_path / "matrix.json"
    job = run_job(["-np", str(world), "--transport", transport, "--", sys.executable,
                   worker("matrix_worker.py"), str(out)],
                  timeout=JOB_TIMEOUT, env={"RINGLET_TIMEOUT": "60"})
    ranks = load_rank_files(out, world)
    missing = [r for r, s in enumerate(ranks) if s is None]
    assert not missing, f"ranks {missing} wrote no summary\n{job_report(job)}"
    lines, failed = [], 0
    for s in ranks:
        failed += len(s["failed"])
        if s["aborted"]:
            lines.append(f"rank {s['rank']}: ABORTED: {s['aborted']}")
        for f in s["failed"][:25]:
            lines.append(f"rank {s['rank']}: {f['case']}: {f['error']}")
    s0 = ranks[0]
    print(f"{transport} x {world}: {s0['passed']} passed, {failed} failed (all ranks), "
          f"{s0['skipped_count']} skipped on rank 0; job {job.seconds:.1f}s, sections {s0['sections']}")
    assert failed == 0 and not any(s["aborted"] for s in ranks), (
        f"{failed} failing cases over {world} ranks ({transport}):\n" + "\n".join(lines))
    assert job.returncode == 0, job_report(job)
    # Only "native" may be unavailable (for some dtypes on some transports).
    odd = [x["case"] for s in ranks for x in s["skipped"] if " native " not in x["case"]]
    assert not odd, f"unexpected skips: {odd}"

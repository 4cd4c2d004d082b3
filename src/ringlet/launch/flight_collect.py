"""A multi-host job's flight records, collected on its first host when the job fails.

Every host's ranks write their flight records (:mod:`ringlet.flight`) into a folder of their node
launcher's (``<tmp>/ringlet-flight-host-XXXX``, removed when it exits, unless ``RINGLET_FLIGHT_DIR`` is
set). When a host's ranks are done, its node launcher copies their records into the job's store (the
rendezvous store node 0's launcher hosts and keeps up for a few seconds after a failure). When the job
failed, node 0's launcher waits for every host's (at most ``wait`` seconds), writes them all into one
folder on its host and prints where it is and the verdict of ``ringlet diagnose`` on it, as a
single-host job's launcher does. A host that did not deliver in time is named in that line; the verdict
then covers the ranks that did.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from .config import say

ROOT = "ringlet/flight"
MAX_RECORD_BYTES = 16 << 20  # a rank's record larger than this (a huge RINGLET_FLIGHT_RECORDER) stays on its host


def _key(run_id: str, what: str) -> str:
    return f"{ROOT}/{run_id}/{what}"


def push(store, run_id: str, folder: str, node_rank: int) -> list[int]:
    """Copy the ``rank-<R>.json`` records of ``folder`` into ``store``; then count this host as delivered.
    Returns the ranks copied."""
    ranks = []
    for p in sorted(Path(folder).glob("rank-*.json")):
        try:
            rank = int(p.stem.split("-", 1)[1])
            data = p.read_bytes()
        except (OSError, ValueError):
            continue
        if len(data) > MAX_RECORD_BYTES:
            say(f"flight record of rank {rank} ({len(data) >> 20} MiB) left on this host: {p}")
            continue
        store.set(_key(run_id, f"rank/{rank}"), data)
        ranks.append(rank)
    store.set(_key(run_id, f"host/{node_rank}"), json.dumps(ranks))
    store.add(_key(run_id, "hosts"), 1)
    return ranks


def _gather(store, run_id: str, nnodes: int, world: int, wait: float, out: str | None = None) -> tuple[str, list[int]]:
    """Wait up to ``wait`` seconds for all ``nnodes`` hosts to deliver; write every delivered record into
    ``out`` (default: a new ``<tmp>/ringlet-flight-XXXX``). Returns the folder and the node ranks that
    did not deliver."""
    deadline = time.monotonic() + wait
    while store.add(_key(run_id, "hosts"), 0) < nnodes and time.monotonic() < deadline:
        time.sleep(0.1)
    folder = out or tempfile.mkdtemp(prefix="ringlet-flight-")
    os.makedirs(folder, exist_ok=True)
    for rank in range(world):
        key = _key(run_id, f"rank/{rank}")
        if store.check([key]):
            dest = os.path.join(folder, f"rank-{rank}.json")
            tmp = dest + ".tmp"
            with open(tmp, "wb") as fh:
                fh.write(store.get(key))
            os.replace(tmp, dest)
    missing = [n for n in range(nnodes) if not store.check([_key(run_id, f"host/{n}")])]
    return folder, missing


def collect(store, run_id: str, node_rank: int, nnodes: int, world: int, local_folder: str, wait: float,
            gather: bool) -> None:
    """One node launcher whose ranks are done: deliver this host's records; with ``gather`` (the job
    failed) node 0 then gathers everyone's and prints the folder and the verdict (see the module
    docstring). Store trouble is reported, not raised: the launcher's own report of a failure comes first."""
    from .flight_dir import report

    try:
        push(store, run_id, local_folder, node_rank)
        if node_rank != 0 or not gather:
            return
        folder, missing = _gather(store, run_id, nnodes, world, wait)
    except Exception as exc:  # noqa: BLE001 - the store went away with the job
        say(f"flight records not {'collected' if gather else 'delivered'}: {exc}")
        return
    if missing:
        say(f"flight records: hosts {missing} (node ranks) did not deliver theirs within {wait:g} s")
    report(folder)

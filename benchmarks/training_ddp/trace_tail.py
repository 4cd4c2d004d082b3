"""Where the exposed communication of a DDP step goes, across the ranks of one job.

``ringlet report`` reads one rank's timeline; this reads all of them (``RINGLET_TIMELINE=/tmp/t_{rank}.json``
writes one per rank, on one clock: every process of a host, and every emulated host of one machine,
shares the monotonic clock). Per steady step it measures:

* skew    — how far apart the ranks finish backward (last minus first end of the BACKWARD spans),
* overrun — how long the next-to-last collective was still running after the slowest rank's backward
  ended (0 when it was done by then),
* last    — the last collective of the step, from the later of those two moments to its end on the last
  rank: what the slowest rank cannot hide at all.

    python benchmarks/training_ddp/trace_tail.py /tmp/t_{rank}.json --ranks 4 --skip 20
"""
from __future__ import annotations

import argparse
import statistics

from ringlet.timeline import read_events


def spans(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e.get("name") == name and e.get("ph") == "X"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pattern", help="timeline path with {rank}")
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--skip", type=int, default=20, help="steps left out at the start (warm-up, tuner trials)")
    args = parser.parse_args()

    events = [read_events(args.pattern.format(rank=r)) for r in range(args.ranks)]
    fwd = [spans(e, "FORWARD") for e in events]
    bwd = [spans(e, "BACKWARD") for e in events]
    comm = [spans(e, "COMMUNICATE") for e in events]
    steps = min(len(b) for b in bwd) - 1  # the last step has no next forward to close it
    skew, overrun, last, used = [], [], [], 0
    for s in range(args.skip, steps):
        lo = min(f[s]["ts"] for f in fwd)
        hi = min(f[s + 1]["ts"] for f in fwd)
        ends = [b[s]["ts"] + b[s]["dur"] for b in bwd]
        per_rank = [[c for c in cs if lo <= c["ts"] < hi] for cs in comm]
        if any(len(p) < 2 for p in per_rank) or len({len(p) for p in per_rank}) != 1:
            continue  # a step without the same collectives on every rank (tuner switch, fallback)
        used += 1
        slowest = max(ends)
        before_last = max(p[-2]["ts"] + p[-2]["dur"] for p in per_rank)
        done = max(p[-1]["ts"] + p[-1]["dur"] for p in per_rank)
        skew.append((slowest - min(ends)) / 1000)
        overrun.append(max(0.0, before_last - slowest) / 1000)
        last.append((done - max(slowest, before_last)) / 1000)
    if not used:
        raise SystemExit("no step had the same collectives on every rank")
    med = statistics.median
    print(f"{used} steps, {len(per_rank[0])} collectives each; medians: backward-end skew {med(skew):.1f} ms, "
          f"next-to-last collective still running {med(overrun):.1f} ms (in {sum(o > 0 for o in overrun)} steps), "
          f"last collective after that {med(last):.1f} ms")


if __name__ == "__main__":
    main()

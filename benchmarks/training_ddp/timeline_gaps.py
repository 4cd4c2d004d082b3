"""How long the Horovod-style path waits between the end of backward and the start of its all-reduce.

Reads the per-rank timelines of one traced ``paired_ddp.py`` run (``--timeline /tmp/t_{rank}.json``;
every rank on one machine, so their clocks agree) and prints, per step, the time from the last rank's
end of ``BACKWARD`` to the first ``COMMUNICATE`` that starts after it on any rank: the negotiation and
wake-up latency on the critical path, which torch's DDP does not have.

    python benchmarks/training_ddp/timeline_gaps.py /tmp/t_{rank}.json 4
"""
from __future__ import annotations

import json
import statistics
import sys


def spans(path: str, name: str) -> list[tuple[float, float]]:
    with open(path) as f:
        ev = json.load(f)
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name") == name and e.get("ph") == "X")


def main() -> None:
    pattern, ranks = sys.argv[1], int(sys.argv[2])
    back = [spans(pattern.format(rank=r), "BACKWARD") for r in range(ranks)]
    comm = [spans(pattern.format(rank=r), "COMMUNICATE") for r in range(ranks)]
    gaps = []
    for i in range(min(len(b) for b in back)):
        last = max(b[i][1] for b in back)
        starts = [s for c in comm for s, _ in c if s >= last - 1000.0]  # 1 ms of clock slack
        if starts:
            gaps.append((min(starts) - last) / 1000.0)
    q = statistics.quantiles(gaps, n=4)
    print(f"{len(gaps)} steps: last backward end -> first all-reduce start, ms: median {statistics.median(gaps):.1f}, "
          f"quartiles {q[0]:.1f} / {q[2]:.1f}, min {min(gaps):.1f}, max {max(gaps):.1f}")


if __name__ == "__main__":
    main()

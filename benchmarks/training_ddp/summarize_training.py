"""Print the training table from ``benchmarks/training_ddp/training_cluster.sh``'s logs and reports.

    python benchmarks/training_ddp/summarize_training.py [benchmarks/training_ddp/results/cluster_4x1_1gbit]

Per model and mode: images/s per rank on 1 and on 4 ranks (mean over the repetitions, each repetition a
separate job; modes were interleaved within a repetition), scaling efficiency (4-rank rate / 1-rank rate
of the same mode), step time, and from ringlet's timelines (``ringlet report``, warm-up steps skipped)
the share of communication hidden behind compute and the exposed communication as a share of the step.
The last column compares step times with stock DDP's measured in the same repetitions.
"""
from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

MODES = ("stock-ddp", "ddp", "hvd")
NAMES = {"stock-ddp": "torch DDP (Gloo)", "ddp": "ringlet DDP", "hvd": "ringlet hvd (DistributedOptimizer)"}
RATE = re.compile(r"img/s per rank: ([\d.]+)")
BATCH = re.compile(r"batch (\d+) per rank")
ALGO = re.compile(r"all-reduce algorithm in use: (\S+)")
HIDDEN = re.compile(r"communication hidden behind compute: ([\d.]+)%; exposed communication: ([\d.]+)% of the step")


def rate(log: Path) -> tuple[float, int, str]:
    text = log.read_text()
    m, b, a = RATE.search(text), BATCH.search(text), ALGO.search(text)
    if not m or not b:
        raise ValueError(f"{log}: no result line (did the job fail?)")
    return float(m.group(1)), int(b.group(1)), a.group(1) if a else "-"


def main(root: str = "benchmarks/training_ddp/results/cluster_4x1_1gbit") -> None:
    d = Path(root)
    models = sorted({p.name.split("_")[0] for p in d.glob("*_np4_r*.log")})
    print("| model | mode | img/s/rank, 1 rank | img/s/rank, 4 ranks | scaling eff. | step ms | comm hidden | "
          "exposed comm / step | step time vs torch DDP | algorithm |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in models:
        steps: dict[str, list[float]] = {}
        rows = []
        for mode in MODES:
            logs = sorted(d.glob(f"{model}_{mode}_np4_r*.log"))
            if not logs:
                continue
            runs = [rate(p) for p in logs]
            r4 = statistics.mean(r for r, _, _ in runs)
            batch = runs[0][1]
            steps[mode] = [1000 * batch / r for r, _, _ in runs]
            one = d / f"{model}_{mode}_np1.log"
            r1 = rate(one)[0] if one.exists() else None
            hid = [HIDDEN.search(p.read_text()) for p in sorted(d.glob(f"{model}_{mode}_r*.report.txt"))]
            hid = [m for m in hid if m]
            hidden = f"{statistics.mean(float(m.group(1)) for m in hid):.0f}%" if hid else "-"
            exposed = f"{statistics.mean(float(m.group(2)) for m in hid):.0f}%" if hid else "-"
            algos = ",".join(sorted({a for _, _, a in runs}))
            rows.append((mode, r1, r4, hidden, exposed, algos, [f"{r:.1f}" for r, _, _ in runs]))
        base = steps.get("stock-ddp")
        for mode, r1, r4, hidden, exposed, algos, each in rows:
            eff = f"{r4 / r1:.0%}" if r1 else "-"
            step = statistics.mean(steps[mode])
            if base and mode != "stock-ddp":
                ratios = [a / b for a, b in zip(steps[mode], base)]
                vs = f"{statistics.mean(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})"
            else:
                vs = "1"
            print(f"| {model} | {NAMES[mode]} | {r1 or '-'} | {r4:.1f} ({', '.join(each)}) | {eff} | {step:.0f} | "
                  f"{hidden} | {exposed} | {vs} | {algos} |")


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Per algorithm and shape: the cost model's MAE at >= 1 MiB in every all-shape sweep kept since session
25 (attempts 12-18, from their errors.md), and in how many of them it met the 10% target.
    python benchmarks/results/cost_model_s28/probes/met_per_run.py"""
import collections
import os

R = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
RUNS = ["cost_model_s25/attempt12", "cost_model_s27/attempt13", "cost_model_s27/attempt14",
        "cost_model_s27/attempt15", "cost_model_s27/attempt16", "cost_model_s28/attempt17",
        "cost_model_s28/attempt18"]
seen = collections.defaultdict(list)
for run in RUNS:
    for line in open(os.path.join(R, run, "errors.md")):
        c = [x.strip() for x in line.split("|")]
        if len(c) > 5 and "gbit" in c[1]:
            seen[(c[1], c[2])].append((run[-2:], float(c[4])))
met = runs = 0
for (shape, algorithm), v in sorted(seen.items()):
    ok = sum(x <= 10 for _, x in v)
    met, runs = met + ok, runs + len(v)
    print(f"{shape:11s} {algorithm:19s} " + " ".join(f"a{a}:{x:4.1f}" for a, x in v) + f"  met in {ok} of {len(v)}")
print(f"all: {met} of {runs} runs within 10%; every pair at least once: {all(any(x <= 10 for _, x in v) for v in seen.values())}")

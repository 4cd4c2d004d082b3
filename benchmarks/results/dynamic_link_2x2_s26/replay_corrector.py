"""Replay the DDP's corrector (ringlet.tuning.adaptive.Adaptive, or a variant file) over a dynamic_link
run: every rank's COMMUNICATE spans and backward times from its timeline, the choices that ran from
adapt.json, one agreement every 10 steps. Prints per round the fitted factors and the corrected model's
predictions for the two tracked buckets. Decisions are not replayed (the run's choices are fed).

    python replay_corrector.py RUN_DIR [--module PATH_TO_ADAPTIVE_VARIANT.py]
"""
import argparse, bisect, importlib.util, json, re, sys

from ringlet.torch.training.adapt import ddp_policy
from ringlet.tuning.model import Model
from ringlet.tuning.profile import Profile

ap = argparse.ArgumentParser()
ap.add_argument("run")
ap.add_argument("--module", default=None)
ap.add_argument("--every", type=int, default=10)
args = ap.parse_args()
if args.module:
    spec = importlib.util.spec_from_file_location("adaptive_variant", args.module)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["adaptive_variant"] = mod
    spec.loader.exec_module(mod)
else:
    from ringlet.tuning import adaptive as mod
R = args.run
raw = json.load(open(R + "/profile_10gbit.json"))
prof = Profile.from_dict(raw)
host_of = tuple(h for h, k in enumerate(raw["fingerprint"]["layout"]) for _ in range(k))
d = json.load(open(R + "/adapt.json"))


def parse(s):
    m = re.match(r"(\w+) @ (\d+) B", s)
    return m.group(1), int(m.group(2))


per_rank = []
for r in range(len(host_of)):
    ev = json.load(open(f"{R}/adapt_timeline_{r}.json"))
    tids = {e["tid"]: e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    starts = sorted(e["ts"] for e in ev if e.get("name") == "step")
    recs = {}
    for e in ev:
        if e.get("name") in ("COMMUNICATE", "BACKWARD"):
            s = bisect.bisect_right(starts, e["ts"]) - 1
            key = tids[e["tid"]].split(".")[-1] if e["name"] == "COMMUNICATE" else "backward"
            recs.setdefault(s, []).append((key, e.get("args", {}).get("bytes", 0), e["dur"] * 1e-6))
    per_rank.append(recs)
model = Model(prof.network)
ads = [mod.Adaptive(model, host_of, policy=ddp_policy()) for _ in host_of]
tracked = {}
for s, rec in enumerate(d["steps"]):
    for r, a in enumerate(ads):
        for key, nb, sec in per_rank[r].get(s, []):
            if key == "backward":
                a.record_backward(sec)
            elif key in rec["choices"]:
                alg, seg = parse(rec["choices"][key])
                tracked[key] = nb
                a.record(alg, nb, sec, seg)
    if s % args.every == 2 and s > 60:
        nums = [sum(x) for x in zip(*(a.numbers() for a in ads))]
        for a in ads:
            a._fit(nums)
        a = ads[0]
        f = " ".join(f"{n}x{x:.2f}" for n, x in zip(mod.FEATURES, a.factors) if x != 1.0)
        out = []
        for key, nb in sorted(tracked.items()):
            rk = model.ranking(nb, host_of, network=a.fitted)
            t = {x.choice.algorithm: x.seconds * 1e3 for x in rk}
            out.append(f"{key} {nb} B: best {rk[0].choice.algorithm} " +
                       " ".join(f"{k} {t[k]:.1f}" for k in ("ring", "hierarchical", "tree")))
        print(f"step {s} ran {rec['choices'].get('bucket0', '?').split()[0]} | {f or 'none'} | " + " | ".join(out))

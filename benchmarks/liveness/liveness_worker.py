"""One rank of a liveness trial (``benchmarks/liveness/liveness_trials.py``): all-reduce in a loop until told to
stop or until a collective fails, then record what was raised and when.

Writes ``OUT/pid-R`` (its pid), ``OUT/ready-R`` after the warm-up, and ``OUT/res-R.json``: ``ok``, the
exception's type, message, ``rank``/``host`` attributes and the wall-clock time it was raised.
``--control``: a 256 MiB all-reduce (or ``--big-mib``) instead of the loop; it must raise nothing.
"""
import argparse
import faulthandler
import json
import os
import signal
import sys
import time

import torch

import ringlet


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, default=300.0)
    p.add_argument("--mib", type=float, default=16.0, help="size of each all-reduce of the loop")
    p.add_argument("--control", action="store_true")
    p.add_argument("--big-mib", type=float, default=256.0)
    a = p.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks on demand, for a rank that hangs
    ringlet.init()
    r = ringlet.rank()
    with open(os.path.join(a.out, f"pid-{r}"), "w") as f:
        f.write(str(os.getpid()))
    res = {"rank": r, "host": os.environ.get("RINGLET_HOSTNAME", ""), "ok": True, "n": 0}
    t0 = time.time()
    try:
        if a.control:
            t = torch.ones(int(a.big_mib * (1 << 20)) // 4)
            ringlet.allreduce_(t)
            res["n"], res["value"] = 1, float(t[0])
        else:
            t = torch.ones(int(a.mib * (1 << 20)) // 4)
            while time.time() - t0 < a.seconds:
                ringlet.allreduce(t)
                res["n"] += 1
                if res["n"] == 3:
                    open(os.path.join(a.out, f"ready-{r}"), "w").close()
    except Exception as exc:  # noqa: BLE001 - what the trial measures
        res.update(ok=False, type=type(exc).__name__, msg=str(exc)[:400], peer=getattr(exc, "rank", None),
                   peer_host=getattr(exc, "host", None), t=time.time())
    res["elapsed"] = time.time() - t0
    with open(os.path.join(a.out, f"res-{r}.json"), "w") as f:
        json.dump(res, f)
    print(f"rank {r}: {res}", file=sys.stderr, flush=True)
    ringlet.shutdown() if res["ok"] else time.sleep(1.0)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""One rank of tests/multiproc/test_liveness_processes.py: all-reduce in a loop until a collective
fails or ``--seconds`` pass; record what was raised.

``--iters N`` ends the loop after N all-reduces on every rank (a run that must succeed). Writes ``OUT/pid-R``, ``OUT/ready-R`` once in the loop, and ``OUT/res-R.json`` (``ok``, the error's type,
message and ``rank``/``host`` attributes). ``--pause S``: rank 1 sleeps S seconds between two
all-reduces (a long backward: a slow but live peer).
"""
import argparse
import json
import os
import sys
import time

import torch

import ringlet


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--iters", type=int, default=0, help="stop after this many all-reduces (0: --seconds)")
    p.add_argument("--pause", type=float, default=0.0)
    a = p.parse_args()
    ringlet.init()
    r = ringlet.rank()
    with open(os.path.join(a.out, f"pid-{r}"), "w") as f:
        f.write(str(os.getpid()))
    res = {"rank": r, "ok": True, "n": 0}
    t0 = time.time()
    try:
        t = torch.ones(1 << 16)
        while (res["n"] < a.iters) if a.iters else (time.time() - t0 < a.seconds):
            ringlet.allreduce(t)
            res["n"] += 1
            if res["n"] == 3:
                open(os.path.join(a.out, f"ready-{r}"), "w").close()
            if a.pause and r == 1 and res["n"] == 5:
                time.sleep(a.pause)
    except Exception as exc:  # noqa: BLE001 - what the test checks
        res.update(ok=False, type=type(exc).__name__, msg=str(exc)[:500], peer=getattr(exc, "rank", None),
                   peer_host=getattr(exc, "host", None))
    with open(os.path.join(a.out, f"res-{r}.json"), "w") as f:
        json.dump(res, f)
    if res["ok"]:
        ringlet.shutdown()
        return 0
    time.sleep(1.0)  # let the other survivors raise before the launcher stops this host
    return 1


if __name__ == "__main__":
    sys.exit(main())

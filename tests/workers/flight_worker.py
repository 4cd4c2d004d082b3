"""The pitfall of asymmetric control flow: rank 2 skips one all-reduce, lingers, then shuts down; ranks 0
and 1 fail in their third. Every rank leaves its flight record in RINGLET_FLIGHT_DIR; the test runs
``ringlet diagnose`` on them. Writes ``<out>.rank<R>``: the rank and how its last call ended; a rank whose
call failed then exits with status 1, so the job fails as a user's would."""
import json
import sys
import time

import torch

import ringlet

out = sys.argv[1]
ringlet.init()
rank = ringlet.rank()
outcome = "ok"
try:
    for _ in range(3 if rank < 2 else 2):
        ringlet.allreduce(torch.ones(4))  # the call rank 2 makes one time fewer
except ringlet.RingletError as exc:
    outcome = type(exc).__name__
if rank == 2:
    time.sleep(1.0)
ringlet.shutdown()
with open(f"{out}.rank{rank}", "w") as fh:
    json.dump({"rank": rank, "outcome": outcome}, fh)
sys.exit(0 if outcome == "ok" else 1)

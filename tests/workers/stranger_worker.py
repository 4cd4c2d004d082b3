"""A job that a stranger tries to join (tests/multiproc/test_strangers.py).

Rank 0 writes the job's store and rendezvous endpoints to ``OUT/ports.json`` (``MASTER_ADDR``/
``MASTER_PORT``, and under ``--elastic`` the driver's ``RINGLET_ELASTIC_ADDR``/``_PORT``), every rank its Gloo listeners to
``OUT/gloo-R.json``; every rank
then waits for ``OUT/go`` (the test's stranger has tried), all-reduces 20 times and writes whether
every result was right to ``OUT/res-R.json``.
"""
import json
import os
import sys
import time

import torch

import ringlet


def main() -> int:
    out = sys.argv[1]
    ringlet.init()
    r, n = ringlet.rank(), ringlet.size()
    if r == 0:
        ports = {"store": [os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")],
                 "elastic": [os.environ.get("RINGLET_ELASTIC_ADDR"), os.environ.get("RINGLET_ELASTIC_PORT")]}
        with open(os.path.join(out, "ports.tmp"), "w") as f:
            json.dump(ports, f)
        os.replace(os.path.join(out, "ports.tmp"), os.path.join(out, "ports.json"))
    from ringlet.transport import torchdist

    listening = [list(addr[:2]) for _, addr in torchdist.gloo_sockets.listening()]
    with open(os.path.join(out, f"gloo-{r}.json"), "w") as f:
        json.dump({"rank": r, "host": os.environ.get("RINGLET_HOSTNAME"), "listening": listening}, f)
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(out, "go")) and time.time() < deadline:
        time.sleep(0.1)
    ok = True
    for i in range(20):
        t = torch.full((1000 + i,), float(r + 1))
        ringlet.allreduce_(t, op=ringlet.ReduceOp.SUM)
        ok = ok and bool((t == n * (n + 1) / 2).all())
    with open(os.path.join(out, f"res-{r}.json"), "w") as f:
        json.dump({"rank": r, "ok": ok}, f)
    ringlet.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Strangers at a running job's ports on the emulated cluster: the store (node 0, also the static
rendezvous) and every rank's Gloo listeners, approached from another emulated host by a process
without the job's secret. The job must finish with correct results, and each refusal must be logged.

    ringlet cluster up --hosts 4 --link 1gbit --cpus-per-host 0.5
    python benchmarks/liveness/stranger_trials.py --trials 3 --out benchmarks/liveness/results/strangers.json

The stranger (this script re-run inside host ``rgl-h3`` with ``--stranger``) tries torch's
``TCPStore`` client and random bytes at the store, and an idle connection, random bytes and a fake
Gloo sequence number at each listener of ranks on other hosts.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE.parent.parent / "tests" / "multiproc" / "stranger_worker.py"
NP = 4


def stranger(addr: str, port: int, gloo: list) -> dict:
    """Run inside an emulated host: knock on every door; return what each attempt got."""
    import torch.distributed as dist

    got = {}
    try:
        dist.TCPStore(addr, port, is_master=False, timeout=datetime.timedelta(seconds=3)).set("x", "1")
        got["store/torch-client"] = "ACCEPTED"
    except Exception as exc:  # noqa: BLE001
        got["store/torch-client"] = f"refused: {type(exc).__name__}"
    held = []
    for h, p in gloo:
        for how in ("idle", "bytes", "seq"):
            try:
                s = socket.create_connection((h, p), timeout=3)
                if how == "bytes":
                    s.sendall(os.urandom(256))
                elif how == "seq":
                    s.sendall(struct.pack("<Q", 0))
                held.append((f"{h}:{p}/{how}", s))
                got[f"gloo {h}:{p}/{how}"] = "connected"
            except OSError as exc:
                got[f"gloo {h}:{p}/{how}"] = f"unreachable: {exc}"
    time.sleep(3.0)  # two heartbeats: the ranks' watch finds and refuses them
    for name, s in held:
        s.setblocking(False)
        try:
            data = s.recv(1)
            state = "closed by the rank" if data == b"" else "open"
        except BlockingIOError:
            state = "still open"
        except OSError as exc:
            state = f"reset ({exc.__class__.__name__})"
        got[f"gloo {name} after 3 s"] = state
        s.close()
    return got


def trial(rsh_host: str) -> dict:
    out = Path(tempfile.mkdtemp(prefix="strangers-"))
    cmd = [sys.executable, "-m", "ringlet.cli.main", "run", "--cluster", "-np", str(NP), "--transport", "torch",
           "--", sys.executable, str(WORKER), str(out)]
    t0 = time.time()
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while not (out / "ports.json").exists() or len(list(out.glob("gloo-*.json"))) < NP:
        if job.poll() is not None or time.time() - t0 > 120:
            break
        time.sleep(0.2)
    ports = json.loads((out / "ports.json").read_text())
    addr, port = ports["store"]
    gloo = [tuple(x) for r in range(NP) for x in json.loads((out / f"gloo-{r}.json").read_text())["listening"]]
    mine = [g for g in gloo if not g[0].endswith(".4")]  # listeners on other hosts than the stranger's
    probe = subprocess.run([sys.executable, "-m", "ringlet.cli.main", "cluster", "exec", rsh_host, "--",
                            sys.executable, __file__, "--stranger", json.dumps([addr, int(port), mine])],
                           capture_output=True, text=True, timeout=120)
    (out / "go").touch()
    text, _ = job.communicate(timeout=180)
    res = [json.loads((out / f"res-{r}.json").read_text())["ok"] for r in range(NP) if (out / f"res-{r}.json").exists()]
    got = json.loads(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 else {"error": probe.stderr[-800:]}
    logged = [ln for ln in text.splitlines() if "refused a connection from" in ln]
    return {"rc": job.returncode, "results_ok": res, "stranger": got, "logged": logged,
            "ok": job.returncode == 0 and res == [True] * NP and not any("ACCEPTED" in v for v in got.values())
            and any("store" in ln for ln in logged) and any("transport" in ln for ln in logged)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--out", default=None)
    p.add_argument("--stranger", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.stranger:
        addr, port, gloo = json.loads(a.stranger)
        print(json.dumps(stranger(addr, port, gloo)))
        return 0
    rows = [trial("rgl-h3") for _ in range(a.trials)]
    for r in rows:
        print(json.dumps({"ok": r["ok"], "rc": r["rc"], "results_ok": r["results_ok"], "logged": len(r["logged"])}))
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    print(f"{sum(r['ok'] for r in rows)}/{len(rows)} passed")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

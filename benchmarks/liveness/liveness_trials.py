"""Silent and dead peers on the emulated cluster: cut a host's link, SIGSTOP a rank, or kill -9 a rank
in the middle of an all-reduce loop, and measure when every survivor raises and whom it names.

    ringlet cluster up --hosts 4 --link 1gbit --cpus-per-host 0.5
    python benchmarks/liveness/liveness_trials.py --trials 10 --out benchmarks/liveness/results/trials.json
    python benchmarks/liveness/liveness_trials.py --control --out benchmarks/liveness/results/control.json

Each trial runs ``ringlet run --cluster -np 4 -- python benchmarks/liveness/liveness_worker.py`` (one rank per
emulated host), waits until every rank is in its loop, injects the fault into the victim (ranks 1-3 in
turn) and bounds the job by ``--bound`` seconds. A trial passes when every survivor raised a
``PeerError`` naming the victim within the limit (30 s, 10 s for kill -9), the launcher exited non-zero
and nothing hung. ``--control`` throttles one host to 0.1 CPU (``--cpus``) and all-reduces 256 MiB (``--big-mib``):
nothing may raise.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE / "liveness_worker.py"
LIMIT = {"cut": 30.0, "stop": 30.0, "kill": 10.0}
NP = 4


def launch(out: str, extra: list[str], env: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ringlet.cli.main", "run", "--cluster", "-np", str(NP), "--transport", "torch",
           "--", sys.executable, str(WORKER), "--out", out, *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env}, start_new_session=True)


def wait_ready(out: str, proc: subprocess.Popen, timeout: float = 120.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if all(os.path.exists(os.path.join(out, f"ready-{r}")) for r in range(NP)):
            return True
        time.sleep(0.2)
    return False


def inject(kind: str, victim: int, out: str) -> None:
    pid = int(Path(out, f"pid-{victim}").read_text())
    if kind == "kill":
        os.kill(pid, signal.SIGKILL)
    elif kind == "stop":
        os.kill(pid, signal.SIGSTOP)
    else:
        subprocess.run(["ip", "netns", "exec", f"rgl-h{victim}", "ip", "link", "set", "eth0", "down"], check=True)


def restore(kind: str, victim: int) -> None:
    if kind == "cut":
        subprocess.run(["ip", "netns", "exec", f"rgl-h{victim}", "ip", "link", "set", "eth0", "up"], check=False)


def finish(proc: subprocess.Popen, bound: float) -> tuple[int | None, str, bool]:
    try:
        text, _ = proc.communicate(timeout=bound)
        return proc.returncode, text, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        return proc.returncode, text, True


def results(out: str) -> dict[int, dict]:
    found = {}
    for r in range(NP):
        p = Path(out, f"res-{r}.json")
        if p.exists():
            found[r] = json.loads(p.read_text())
    return found


def trial(kind: str, victim: int, bound: float, env: dict) -> dict:
    out = tempfile.mkdtemp(prefix=f"liveness-{kind}-")
    proc = launch(out, ["--seconds", "600"], env)
    t_start = time.time()
    if not wait_ready(out, proc):
        rc, text, hung = finish(proc, 5.0)
        return {"kind": kind, "victim": victim, "error": "never ready", "tail": text[-2000:]}
    t_inj = time.time()
    inject(kind, victim, out)
    try:
        rc, text, hung = finish(proc, bound)
    finally:
        restore(kind, victim)
    t_end = time.time()
    res = results(out)
    survivors = [r for r in range(NP) if r != victim]
    lat = {r: (res[r]["t"] - t_inj) if r in res and not res[r]["ok"] else None for r in survivors}
    named = {r: r in res and res[r].get("peer") == victim for r in survivors}
    ok = (not hung and rc not in (0, None) and all(named.values())
          and all(v is not None and v <= LIMIT[kind] for v in lat.values()))
    return {"kind": kind, "victim": victim, "ok": ok, "rc": rc, "hung": hung, "latency": lat, "named": named,
            "job_seconds": t_end - t_start, "after_inject_seconds": t_end - t_inj,
            "messages": {r: res[r].get("msg") for r in survivors if r in res},
            "launcher_culprit": [ln for ln in text.splitlines() if ln.startswith("ringlet run:")][-4:]}


def control(bound: float, env: dict, cpus: float, mib: float) -> dict:
    """One host throttled to ``cpus`` CPU, an all-reduce of ``mib`` MiB at the cluster's link rate."""
    from ringlet.cluster import state as st

    s = st.load()
    group = Path(s.cgroup_path(s.hosts[NP - 1]))
    if s.cgroup_version == 1:
        path, text = group / "cpu.cfs_quota_us", str(int(cpus * int((group / "cpu.cfs_period_us").read_text())))
    else:
        path, text = group / "cpu.max", f"{int(cpus * 100000)} 100000"
    old = path.read_text().strip()
    path.write_text(text)
    out = tempfile.mkdtemp(prefix="liveness-control-")
    try:
        t0 = time.time()
        proc = launch(out, ["--control", "--big-mib", str(mib)], env)
        rc, text, hung = finish(proc, bound)
    finally:
        path.write_text(old)
    res = results(out)
    return {"kind": "control", "cpus": cpus, "mib": mib, "rc": rc, "hung": hung, "seconds": time.time() - t0,
            "ok": rc == 0 and not hung and len(res) == NP and all(v["ok"] for v in res.values()),
            "values": {r: v.get("value") for r, v in res.items()}, "tail": text[-1500:] if rc else ""}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--kinds", default="cut,stop,kill")
    p.add_argument("--bound", type=float, default=120.0, help="seconds after the fault a job may take")
    p.add_argument("--control", action="store_true")
    p.add_argument("--cpus", type=float, default=0.1)
    p.add_argument("--big-mib", type=float, default=256.0, help="--control: size of the all-reduce")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    env = {"RINGLET_TIMEOUT": "300"}
    if a.control:
        rows = [control(600.0, env, a.cpus, a.big_mib)]
    else:
        rows = []
        for i in range(a.trials):
            for kind in a.kinds.split(","):
                row = trial(kind, 1 + i % (NP - 1), a.bound, env)
                rows.append(row)
                print(json.dumps({k: row.get(k) for k in ("kind", "victim", "ok", "rc", "latency", "hung")}),
                      flush=True)
    Path(a.out).write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if not r.get("ok")]
    print(f"{len(rows) - len(bad)}/{len(rows)} passed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""What serving metrics costs a rank, paired in one job: blocks with a scrape every ``--interval`` seconds
and blocks without alternate (the order swapped every round), for a 4 KiB all-reduce and for a step of
the synthetic CNN under ringlet's DDP. A scrape here is what the endpoint's HTTP handler does for each
request (fold the records and the steps since the previous scrape, write the exposition), run on a
thread of the rank itself, so the cost lands on the rank as Prometheus's requests would; the socket
I/O is left out. Rank 0 prints (and writes ``--out``) the median time per call or step of each arm and
the per-round ratio scraped/idle.

    ringlet run -np 2 --transport shm --metrics-port 19400 -- python benchmarks/metrics/overhead.py --out r.json

Also reports the per-collective bookkeeping that is always on (the algorithm that ran copied into the
flight record, the recorder's append count), timed in isolation.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import timeit
import types

import torch
from prometheus_client import generate_latest

import ringlet
from ringlet.metrics import serve
from ringlet.torch.training.ddp import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from synthetic_benchmark import cnn  # noqa: E402  examples/synthetic_benchmark.py


class Scraper:
    """Scrape ``registry`` every ``interval`` seconds while on."""

    def __init__(self, registry, interval: float) -> None:
        self.registry, self.interval, self.on, self.count = registry, interval, threading.Event(), 0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.on.wait(0.05) and not self._stop.wait(self.interval):
                generate_latest(self.registry)
                self.count += 1

    def stop(self) -> None:
        self._stop.set()


def paired(run_block, scraper: Scraper, rounds: int) -> dict:
    run_block()  # warm-up
    times, ratios = {"scraped": [], "idle": []}, []
    for r in range(rounds):
        got = {}
        for arm in (("scraped", "idle") if r % 2 == 0 else ("idle", "scraped")):
            (scraper.on.set if arm == "scraped" else scraper.on.clear)()
            ringlet.barrier()
            got[arm] = run_block()
            times[arm].append(got[arm])
        scraper.on.clear()
        ratios.append(got["scraped"] / got["idle"])
    return {"scraped": statistics.median(times["scraped"]), "idle": statistics.median(times["idle"]),
            "ratio_median": statistics.median(ratios), "ratio_mean": statistics.fmean(ratios),
            "ratio_se": statistics.stdev(ratios) / len(ratios) ** 0.5, "rounds": rounds}


def allreduce_block(calls: int):
    t = torch.ones(1024)

    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            ringlet.allreduce_(t)
        return (time.perf_counter() - t0) / calls
    return run


def cnn_block(steps: int, batch: int):
    torch.manual_seed(0)
    model = DistributedDataParallel(cnn())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return (time.perf_counter() - t0) / steps
    return run


def bookkeeping_ns() -> float:
    """The always-on additions per collective, timed alone: ``op.ran`` set and copied into the record,
    the recorder's ``appended`` raised."""
    op, rec, n = types.SimpleNamespace(ran=""), types.SimpleNamespace(algorithm="auto", appended=0), 1_000_000

    def added():
        op.ran = "ring"
        ran = getattr(op, "ran", None)
        if ran:
            rec.algorithm = ran
        rec.appended += 1

    base = min(timeit.repeat(lambda: None, number=n, repeat=5)) / n
    return (min(timeit.repeat(added, number=n, repeat=5)) / n - base) * 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes in the scraped arm")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=2000, help="4 KiB all-reduces per block")
    ap.add_argument("--steps", type=int, default=8, help="CNN steps per block")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out")
    a = ap.parse_args()
    rt = ringlet.init()
    ep = serve.endpoint()
    if ep is None:
        raise SystemExit("overhead.py: start it with ringlet run --metrics-port P (or RINGLET_METRICS_PORT)")
    scraper = Scraper(ep.registry, a.interval)
    res = {"world": rt.size, "transport": rt.transport.name, "interval_s": a.interval,
           "allreduce_4k": paired(allreduce_block(a.calls), scraper, a.rounds),
           "cnn_step": paired(cnn_block(a.steps, a.batch), scraper, a.rounds),
           "scrapes": scraper.count, "bookkeeping_ns_per_collective": bookkeeping_ns()}
    scraper.stop()
    if rt.rank == 0:
        print(json.dumps(res, indent=1))
        if a.out:
            with open(a.out, "w") as fh:
                json.dump(res, fh, indent=1)
    ringlet.shutdown()


if __name__ == "__main__":
    main()

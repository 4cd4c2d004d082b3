"""The in-job part of ``ringlet doctor``: ``python -m ringlet.doctor.job [--quick] [--every-rank] [--json OUT]``
on every rank of a job started by ringlet's launcher.

Participants: one rank per host (local rank 0), or every rank with ``--every-rank`` or when the job has
one host. Every participant measures its compute, memory and MTU at the same time; then the host pairs
run in rounds of disjoint pairs (the circle method), so no two measured pairs share a host: a ping-pong of
16 bytes (latency: half the median round trip; clock offset of the higher host against the lower, NTP
style from the round trip with the least delay) and one-way transfers each way (bandwidth: the best of a
few). Results travel to rank 0 with ``ringlet.send``/``recv``; rank 0 prints the table and the verdict
and writes ``--json``. Other ranks wait in a final barrier. Exit status 0 (the verdict is information).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch

import ringlet

from . import probe
from .verdict import format_table, verdict

_PINGS, _QUICK_PINGS = 50, 10
_SIZES, _QUICK_SIZES = (4 << 20, 16 << 20), (256 << 10,)
_REPS = 3


def rounds(n: int) -> list[list[tuple[int, int]]]:
    """Every pair of ``range(n)`` once, in ``n - 1`` (``n`` odd: ``n``) rounds of disjoint pairs ``(a, b)``,
    ``a < b``."""
    ids = list(range(n)) + ([None] if n % 2 else [])
    m, out = len(ids), []
    for _ in range(m - 1):
        pairs = [(ids[i], ids[m - 1 - i]) for i in range(m // 2)]
        out.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        ids = [ids[0], ids[-1]] + ids[1:-1]
    return out


def _ping(peer: int, lead: bool, count: int) -> dict | None:
    buf = torch.zeros(2, dtype=torch.float64)
    samples = []
    for _ in range(count):
        if lead:
            t1, c1 = time.time(), time.perf_counter()
            ringlet.send(buf, peer)
            ringlet.recv(buf, peer)
            t4, c4 = time.time(), time.perf_counter()
            t2, t3 = buf.tolist()
            samples.append((c4 - c1, ((t2 - t1) + (t3 - t4)) / 2, ((t4 - t1) - (t3 - t2)) / 2))
        else:
            ringlet.recv(buf, peer)
            t2 = time.time()
            buf.copy_(torch.tensor([t2, time.time()], dtype=torch.float64))
            ringlet.send(buf, peer)
    if not lead:
        return None
    best = min(samples, key=lambda s: s[2])
    return {"latency_us": statistics.median(s[0] for s in samples) / 2 * 1e6,
            "clock_offset_s": best[1], "clock_err_s": best[2]}


def _one_way(peer: int, sending: bool, size: int) -> float | None:
    """Seconds for ``size`` bytes to reach ``peer`` and a 1-byte acknowledgement to come back (the sender's
    view); None on the receiving side."""
    data, ack = torch.zeros(size, dtype=torch.uint8), torch.zeros(1, dtype=torch.uint8)
    if sending:
        t0 = time.perf_counter()
        ringlet.send(data, peer)
        ringlet.recv(ack, peer)
        return time.perf_counter() - t0
    ringlet.recv(data, peer)
    ringlet.send(ack, peer)
    return None


def _bandwidth(peer: int, lead: bool, sizes: tuple[int, ...]) -> dict | None:
    """Gbit/s each way (best over sizes and repetitions); only the lead (lower host) returns them."""
    best = {True: 0.0, False: 0.0}  # keyed by "the lead sends"
    for lead_sends in (True, False):
        for size in sizes:
            for _ in range(_REPS):
                dt = _one_way(peer, lead == lead_sends, size)
                if lead == lead_sends:
                    best[lead_sends] = max(best[lead_sends], size * 8 / dt / 1e9)
    if not lead:  # the lead measured a -> b; this side measured b -> a and tells it
        ringlet.send(torch.tensor([best[False]], dtype=torch.float64), peer)
        return None
    mine = {"bw_ab_gbit": best[True]}
    back = torch.tensor([0.0], dtype=torch.float64)
    ringlet.recv(back, peer)  # the other side measured b -> a
    mine["bw_ba_gbit"] = back.item()
    mine["bw_gbit"] = (mine["bw_ab_gbit"] + mine["bw_ba_gbit"]) / 2
    return mine


def _measure_pair(peer_rank: int, lead: bool, opts) -> dict | None:
    pings = _QUICK_PINGS if opts.quick else _PINGS
    sizes = _QUICK_SIZES if opts.quick else _SIZES
    ping = _ping(peer_rank, lead, pings)
    bw = _bandwidth(peer_rank, lead, sizes)
    if not lead:
        return None
    return {**ping, **bw}


def _local(opts) -> dict:
    threads = torch.get_num_threads()
    seconds = 0.3 if opts.quick else 1.0
    return {"name": socket.gethostname(), "ranks": [ringlet.rank()], "threads": threads,
            "gflops_1t": probe.matmul_gflops(1, seconds), "gflops_nt": probe.matmul_gflops(threads, seconds),
            **probe.memory(), "clock_offset_s": 0.0, "clock_err_s": 0.0}


def _send_json(obj, dst: int) -> None:
    raw = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
    ringlet.send(torch.tensor([raw.numel()], dtype=torch.int64), dst)
    ringlet.send(raw, dst)


def _recv_json(src: int):
    n = torch.zeros(1, dtype=torch.int64)
    ringlet.recv(n, src)
    raw = torch.zeros(int(n.item()), dtype=torch.uint8)
    ringlet.recv(raw, src)
    return json.loads(bytes(raw.tolist()).decode())


def _participants(every_rank: bool) -> list[int]:
    """World ranks that measure, in order (rank 0 first): local rank 0 of each host, or every rank."""
    local = ringlet.allgather(torch.tensor([ringlet.local_rank()], dtype=torch.int64)).tolist()
    hosts = ringlet.allgather(torch.tensor([ringlet.cross_rank()], dtype=torch.int64)).tolist()
    if every_rank or len(set(hosts)) == 1:
        return list(range(ringlet.size()))
    return [r for r, lr in enumerate(local) if lr == 0]


def _master_address() -> str:
    """The job's rendezvous address (``MASTER_ADDR``, rank 0's host), resolved; loopback without one. The
    interface whose address the kernel sends from towards it carries the job's traffic (on rank 0's host
    the interface that owns it)."""
    try:
        return socket.gethostbyname(os.environ.get("MASTER_ADDR", "").strip() or "127.0.0.1")
    except OSError as exc:
        raise RuntimeError(f"ringlet doctor: cannot resolve MASTER_ADDR {os.environ['MASTER_ADDR']!r}: {exc}") from None


def _run_participant(me: int, ranks: list[int], opts) -> dict:
    """This participant's host row (index ``me``) and the pairs it led."""
    host = _local(opts)
    host["iface"], host["mtu"] = probe.traffic_interface(_master_address())
    pairs = []
    for rnd in rounds(len(ranks)):
        for a, b in rnd:
            if me in (a, b):
                lead = me == a
                res = _measure_pair(ranks[b] if lead else ranks[a], lead, opts)
                if lead:
                    pairs.append({"a": a, "b": b, **res})
    return {"host": host, "pairs": pairs}


def _assemble(parts: list[dict]) -> dict:
    hosts = [p["host"] for p in parts]
    pairs = sorted((q for p in parts for q in p["pairs"]), key=lambda q: (q["a"], q["b"]))
    for q in pairs:  # clock offsets are reported against rank 0's host only
        offset, err = q.pop("clock_offset_s"), q.pop("clock_err_s")
        if q["a"] == 0:
            hosts[q["b"]]["clock_offset_s"], hosts[q["b"]]["clock_err_s"] = offset, err
    names = [h["name"] for h in hosts]
    for h in hosts:
        if names.count(h["name"]) > 1:
            h["name"] = f"{h['name']}/r{h['ranks'][0]}"
    return {"hosts": hosts, "pairs": pairs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ringlet.doctor.job")
    ap.add_argument("--quick", action="store_true", help="small sizes and few repetitions")
    ap.add_argument("--every-rank", action="store_true", help="measure every rank, not one per host")
    ap.add_argument("--json", default="", help="write the table and verdict here (rank 0)")
    ap.add_argument("--clock-threshold-ms", type=float, default=10.0)
    opts = ap.parse_args(argv)
    ringlet.init()
    try:
        ranks = _participants(opts.every_rank)
        if ringlet.rank() in ranks:
            mine = _run_participant(ranks.index(ringlet.rank()), ranks, opts)
            if ringlet.rank() == 0:
                table = _assemble([mine] + [_recv_json(r) for r in ranks[1:]])
                _report(table, opts)
            else:
                _send_json(mine, 0)
        ringlet.barrier()
    finally:
        ringlet.shutdown()
    return 0


def _report(table: dict, opts) -> None:
    lines = verdict(table, opts.clock_threshold_ms / 1e3)
    table["verdict"] = lines
    print(format_table(table))
    print()
    for line in lines:
        print(f"verdict: {line}")
    sys.stdout.flush()
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

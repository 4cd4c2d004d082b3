"""Soak: many mixed collectives on several groups, every result checked, this process's resources tracked.

    ringlet run -np 8 --transport shm -- python benchmarks/soak/soak.py --ops 10000 --max-bytes 16777216 \
        --seed 1 --out soak.json

Step ``i`` of the plan (:mod:`soak_plan`, identical on every rank) is one of allreduce, allgather
(ragged), broadcast, reduce, reduce_scatter, alltoall and barrier, on the world or one of the sub-groups
made with ``ringlet.new_group``, with a drawn size (log-uniform up to ``--max-bytes``, a share of large
ones), dtype, reduction and algorithm (every all-reduce algorithm, ``native`` where the transport has
one, and ``auto``). Each rank draws, per step, the blocking or the ``_async`` form (up to ``--window``
handles outstanding, waited oldest first or out of order) and the out-of-place or in-place form. Every
result is compared with a locally computed reference (:mod:`soak_ops`); a difference or an exception is
recorded and the soak goes on.

Every ``--sample-every`` steps each rank waits for its handles and records its resident memory
(``/proc/self/statm``; its private and shared parts from ``/proc/self/status``), open descriptors (``/proc/self/fd``), threads (``threading.active_count`` and
``/proc/self/status``) and the number of objects the garbage collector tracks. Each rank writes
``OUT.rankR``; rank 0 then merges them into ``OUT`` and prints the summary of :mod:`soak_summary`
(its verdict against the pass criteria). Exit status 0 when every check passed, 1 otherwise. glibc's
``M_MMAP_THRESHOLD`` is fixed at ``--mmap-threshold`` (docs/testing.md, "The soak", says why).
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field

import torch

import ringlet
from ringlet import memory
from soak_ops import Mode, Pending, complete, describe, issue
from soak_plan import Groups, SizeDraw, make_spec
from soak_summary import merge, print_summary

PAGE = os.sysconf("SC_PAGE_SIZE")
MAX_ERRORS_KEPT = 50
GIVE_UP_AFTER_EXCEPTIONS = 20  # exceptions can leave the ranks' plans out of step; stop before a hang


@dataclass(frozen=True)
class SoakOptions:
    ops: int
    max_bytes: int
    seed: int
    out: str
    window: int = 4
    async_share: float = 0.5
    inplace_share: float = 0.3
    large_share: float = 0.15
    sample_every: int = 100
    rss_limit: float = 0.05
    mmap_threshold: int = 1 << 20


def parse(argv: list[str]) -> SoakOptions:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=10_000, help="steps of the plan")
    ap.add_argument("--max-bytes", type=int, default=16 << 20, help="largest tensor of a step, in bytes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True, help="JSON file (rank files OUT.rankR beside it)")
    ap.add_argument("--window", type=int, default=4, help="most _async handles outstanding per rank")
    ap.add_argument("--async-share", type=float, default=0.5, help="share of calls in the _async form")
    ap.add_argument("--large-share", type=float, default=0.15, help="share of steps in [max/2, max] bytes")
    ap.add_argument("--sample-every", type=int, default=100, help="steps between resource samples")
    ap.add_argument("--rss-limit", type=float, default=0.05,
                    help="largest RSS growth from the baseline sample that passes (inf: not judged)")
    ap.add_argument("--mmap-threshold", type=int, default=1 << 20,
                    help="glibc M_MMAP_THRESHOLD in bytes (0: leave glibc's moving threshold)")
    a = ap.parse_args(argv)
    if a.ops < 1 or a.max_bytes < 1 or a.window < 1 or a.sample_every < 1:
        ap.error("--ops, --max-bytes, --window and --sample-every must be positive")
    return SoakOptions(ops=a.ops, max_bytes=a.max_bytes, seed=a.seed, out=a.out, window=a.window,
                       async_share=a.async_share, large_share=a.large_share, sample_every=a.sample_every,
                       rss_limit=a.rss_limit, mmap_threshold=a.mmap_threshold)


def resources(step: int, t0: float) -> dict:
    """This process's resources now (after step ``step``). ``rss``: resident memory (``/proc/self/statm``);
    ``rss_private``: its anonymous and file-backed part, ``rss_shmem``: its shared-memory part
    (``/proc/self/status``; the shm transport's rings, allocated in full when the job starts)."""
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * PAGE
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    kib = {k: int(status[k].split()[0]) << 10 for k in ("RssAnon", "RssFile", "RssShmem")}
    return {"step": step, "seconds": round(time.monotonic() - t0, 3), "rss": rss,
            "rss_private": kib["RssAnon"] + kib["RssFile"], "rss_shmem": kib["RssShmem"],
            "rss_anon": kib["RssAnon"], "rss_file": kib["RssFile"],
            "fds": open_fds(), "threads": threading.active_count(),
            "threads_os": int(status["Threads"]), "gc_objects": len(gc.get_objects()), **heap_stats()}


def heap_stats() -> dict:
    """glibc's view of this process's heap (:func:`ringlet.memory.heap_info`; empty where it is missing):
    ``heap_used``, the bytes in live allocations in the arenas; ``heap_free``, free bytes the arenas hold;
    ``mmapped``, bytes of allocations served by their own mappings. Plus the sizes of ringlet's bounded
    caches."""
    from ringlet.algorithms import cache, executor
    out = {"schedules": len(cache.SCHEDULES), "plans": len(executor.PLANS)}
    info = memory.heap_info()
    if info is not None:
        out.update(heap_used=info.used, heap_free=info.free, mmapped=info.mmapped)
    return out


def _describe_referrer(r, skip, depth: int = 3) -> str:
    """``r``'s type, and for containers and closure cells who holds them, ``depth`` levels up (``skip``:
    the list of every object, which refers to everything)."""
    name = type(r).__name__ + (f":{r.f_code.co_name}" if hasattr(r, "f_code") else "")
    if type(r).__name__ == "function":
        name += f":{r.__qualname__}"
    if type(r).__name__ == "cell" or (depth and isinstance(r, (list, dict, tuple))):
        up = [_describe_referrer(q, skip, depth - 1) for q in gc.get_referrers(r) if q is not skip][:3]
        name += "<" + ",".join(up) + ">"
    return name


def live_tensors(min_bytes: int = 4 << 20) -> list:
    """Tensors of ``min_bytes`` or more alive now (``SOAK_LIVE=1``): shape, dtype and who refers to them."""
    out = []
    objs = gc.get_objects()
    for obj in objs:
        if isinstance(obj, torch.Tensor) and obj.untyped_storage().nbytes() >= min_bytes:
            refs = [_describe_referrer(r, objs) for r in gc.get_referrers(obj) if r is not out and r is not objs]
            out.append({"shape": list(obj.shape), "dtype": str(obj.dtype),
                        "storage": obj.untyped_storage().nbytes(), "refs": refs[:6]})
    return out


def open_fds() -> int:
    """Open descriptors, not counting files of ``/proc`` being read at that moment (the listing's own,
    and the liveness monitor's read of ``/proc/net/tcp`` every second on another thread)."""
    n = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        n += not target.startswith("/proc/")
    return n


def fixed_mmap_threshold(nbytes: int) -> None:
    """Have glibc serve allocations of ``nbytes`` and more with their own mappings, returned when freed
    (``mallopt(M_MMAP_THRESHOLD)``; it also turns off glibc's moving threshold, which otherwise keeps
    freed tensors of many MiB in the heap, where fragmentation swings the resident size by a fifth)."""
    if nbytes > 0:
        ctypes.CDLL(None).mallopt(-3, int(nbytes))  # M_MMAP_THRESHOLD


@dataclass
class RankState:
    """What one rank has done so far."""

    rank: int
    errors: list = field(default_factory=list)
    error_count: int = 0
    exceptions: int = 0
    counts: dict = field(default_factory=dict)
    payload_bytes: int = 0
    samples: list = field(default_factory=list)
    outstanding: list = field(default_factory=list)

    def note(self, lines: list[str]) -> None:
        self.error_count += len(lines)
        self.errors.extend(lines[:max(MAX_ERRORS_KEPT - len(self.errors), 0)])

    def finish(self, pend: Pending) -> None:
        try:
            self.note(complete(pend, self.rank))
        except Exception as exc:  # noqa: BLE001 - recorded; the soak goes on
            self.failed(pend, exc)

    def failed(self, pend_or_desc, exc: BaseException) -> None:
        what = pend_or_desc if isinstance(pend_or_desc, str) else \
            f"step {pend_or_desc.spec.index} {describe(pend_or_desc.spec, pend_or_desc.mode)}"
        self.exceptions += 1
        self.note([f"{what}: raised {type(exc).__name__}: {exc}"])
        if self.exceptions >= GIVE_UP_AFTER_EXCEPTIONS:
            raise RuntimeError(f"rank {self.rank}: {self.exceptions} collectives raised; giving up") from exc

    def drain(self, keep: int = 0, rng: random.Random | None = None) -> None:
        """Wait for outstanding handles until at most ``keep`` remain (oldest first, or a random one)."""
        while len(self.outstanding) > keep:
            at = rng.randrange(len(self.outstanding)) if rng is not None and rng.random() < 0.3 else 0
            self.finish(self.outstanding.pop(at))


def step(st: RankState, spec, group, mode: Mode, opts: SoakOptions, rng: random.Random) -> None:
    """Issue one step on this rank (a member) and check it now (blocking form) or later."""
    j = spec.members.index(st.rank)
    st.counts[spec.kind] = st.counts.get(spec.kind, 0) + 1
    if spec.kind == "allreduce":
        key = f"allreduce:{spec.algorithm}"
        st.counts[key] = st.counts.get(key, 0) + 1
    st.payload_bytes += spec.nbytes(j)
    try:
        pend = issue(spec, group, st.rank, mode)
    except Exception as exc:  # noqa: BLE001 - recorded; the soak goes on
        st.failed(f"step {spec.index} {describe(spec, mode)}", exc)
        return
    if mode.sync:
        st.finish(pend)
    else:
        st.outstanding.append(pend)
        st.drain(opts.window, rng)


def run_plan(opts: SoakOptions, groups: Groups, handles: list, native: bool) -> RankState:
    """The soak loop on this rank; returns what it did and measured."""
    st = RankState(ringlet.rank())
    rng = random.Random(opts.seed * 1_000_003 + 7_919 * (st.rank + 1))
    sizes = SizeDraw(opts.max_bytes, large_share=opts.large_share)
    t0 = time.monotonic()
    st.samples.append(resources(0, t0))
    for i in range(opts.ops):
        spec = make_spec(i, opts.seed, groups, sizes, native)
        mode = Mode(sync=rng.random() >= opts.async_share, inplace=rng.random() < opts.inplace_share)
        if st.rank in spec.members:
            step(st, spec, handles[spec.group], mode, opts, rng)
        if (i + 1) % opts.sample_every == 0 or i + 1 == opts.ops:
            st.drain()
            st.samples.append(resources(i + 1, t0))
            if os.environ.get("SOAK_LIVE"):
                st.samples[-1]["live_tensors"] = live_tensors()
            if st.rank == 0 and (i + 1) % (opts.sample_every * 5) == 0:
                s = st.samples[-1]
                print(f"soak: step {i + 1}/{opts.ops} {s['seconds']:.0f}s rss {s['rss'] / 2**20:.1f} MiB "
                      f"errors {st.error_count}", flush=True)
    return st


def main(argv: list[str] | None = None) -> int:
    opts = parse(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)
    fixed_mmap_threshold(opts.mmap_threshold)
    rt = ringlet.init()
    rank, p = ringlet.rank(), ringlet.size()
    groups = Groups.for_world(p)
    handles = [None] + [ringlet.new_group(list(m)) for m in groups.members[1:]]  # None: the world
    ringlet.barrier()
    wire0, t0 = ringlet.wire_bytes(), time.monotonic()
    st = run_plan(opts, groups, handles, native=rt.transport.name == "torch")
    wall = time.monotonic() - t0
    wire = ringlet.wire_bytes() - wire0
    record = {"rank": rank, "size": p, "transport": rt.transport.name, "options": opts.__dict__,
              "groups": [list(m) for m in groups.members], "wall_seconds": round(wall, 2),
              "errors": st.errors, "error_count": st.error_count, "exceptions": st.exceptions,
              "counts": st.counts, "payload_bytes": st.payload_bytes, "wire_sent": wire.sent,
              "wire_received": wire.received, "samples": st.samples}
    with open(f"{opts.out}.rank{rank}", "w") as f:
        json.dump(record, f)
    ringlet.barrier()
    ok = st.error_count == 0
    if rank == 0:
        merged = merge(opts.out, p)
        print_summary(merged)
        ok = merged["verdict"]["passed"]
    ringlet.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

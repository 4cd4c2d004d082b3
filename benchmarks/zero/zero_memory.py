"""Peak memory per rank of ringlet's DDP and of ZeRO stages 1-3, beside the theory.

    python benchmarks/zero/zero_memory.py --np 4 --out benchmarks/zero/results/memory_4r_100M.md

Runs one job per arm (``ringlet run -np N --transport shm``), so peaks never mix: ``ddp`` (ringlet's
``DistributedDataParallel`` + ``torch.optim.Adam``) and ``zero1``/``zero2``/``zero3``
(``ringlet.torch.ZeroOptimizer(torch.optim.Adam, model, stage=S)``). The model is an MLP of ``--layers``
square ``Linear(--width, --width)`` layers (default 6 × 4096: 100.7 M parameters, fp32), batch 8.

Measured per rank, over two training steps after one warm-up step: the **peak of live tensor bytes** —
the storages every Python-reachable tensor holds at the start of the window (deduplicated by storage),
plus the largest rise of torch's own allocation record during the steps (``torch.profiler`` with
``profile_memory=True``: every CPU allocation and free, in order). Allocator caching and heap
fragmentation are not in it; they are in the resident set's high-water mark (``VmHWM`` after a reset
through ``/proc/self/clear_refs``, minus the resident set before the model existed), reported beside it.
Also the bytes the optimizer accounts for (``ZeroOptimizer.memory()``; for DDP the parameters, the
gradient buckets and Adam's state) and the theory for Adam in fp32 with Ψ parameters on p ranks: DDP 16Ψ,
stage 1 4Ψ + 4Ψ + 8Ψ/p, stage 2 4Ψ + 12Ψ/p, stage 3 16Ψ/p, each plus the stage's declared working-buffer
bound.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ARMS = ("ddp", "zero1", "zero2", "zero3")
MiB = 1 << 20


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def live_tensor_bytes() -> int:
    """Bytes of the distinct storages of every tensor the garbage collector can reach."""
    import gc

    import torch

    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
                st = obj.untyped_storage()
                seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        except (RuntimeError, ReferenceError):  # a storage freed behind the object: nothing to count
            continue
    return sum(seen.values())


def profiled_peak(fn) -> int:
    """The largest rise of live allocated bytes while ``fn()`` runs (torch's allocation record)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    cur = peak = 0
    for e in events:
        cur += e.self_cpu_memory_usage
        peak = max(peak, cur)
    return peak


def _model(width: int, layers: int):
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def _ddp_accounting(ddp, opt) -> dict:
    params = sum(p.numel() * p.element_size() for p in ddp.module.parameters())
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                if hasattr(t, "numel") and t.dim() > 0)
    return {"parameters": params, "gradients": params, "optimizer": state, "buffers": 0}


def worker(arm: str, width: int, layers: int, out: str) -> None:
    import torch

    import ringlet
    import ringlet.torch as rt

    ringlet.init()
    base = _status_kib("VmRSS")
    model = _model(width, layers)
    if arm == "ddp":
        net = rt.DistributedDataParallel(model)
        opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    else:
        net = model
        opt = rt.ZeroOptimizer(torch.optim.Adam, model, stage=int(arm[-1]), lr=1e-4)
    x = torch.randn(8, width, generator=torch.Generator().manual_seed(ringlet.rank()))

    def step():
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        opt.step()

    step()
    psi = sum(p.numel() for p in model.parameters()) if arm == "ddp" else sum(b.numel for b in opt.layout.buckets)
    start = live_tensor_bytes()
    _reset_peak()
    rise = profiled_peak(lambda: (step(), step()))
    peak = _status_kib("VmHWM")
    acc = _ddp_accounting(net, opt) if arm == "ddp" else dict(opt.memory())
    row = {"arm": arm, "rank": ringlet.rank(), "world": ringlet.size(), "base_kib": base, "peak_kib": peak,
           "rss_bytes": (peak - base) * 1024, "live_start": start, "live_peak": start + rise, "accounted": acc,
           "params": psi}
    with open(os.path.join(out, f"{arm}_{ringlet.rank()}.json"), "w") as fh:
        json.dump(row, fh)
    ringlet.shutdown()


def theory(arm: str, psi: int, p: int) -> float:
    return {"ddp": 16 * psi, "zero1": 8 * psi + 8 * psi / p, "zero2": 4 * psi + 12 * psi / p,
            "zero3": 16 * psi / p}[arm]


def table(rows: list[dict], p: int) -> str:
    out = ["| arm | Ψ (M) | theory (MiB) | declared bound (MiB) | peak live tensors, max over ranks (MiB) | "
           "peak / (theory + bound) | peak per rank (MiB) | RSS high-water rise, max (MiB) | "
           "accounted: params / grads / optimizer / buffers peak (MiB) |",
           "|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for arm in ARMS:
        mine = sorted((r for r in rows if r["arm"] == arm), key=lambda r: r["rank"])
        if not mine:
            continue
        psi = mine[0]["params"]
        peak = max(r["live_peak"] for r in mine)
        rss = max(r["rss_bytes"] for r in mine)
        th = theory(arm, psi, p)
        acc = mine[0]["accounted"]
        bound = acc.get("buffers_bound", 0)
        parts = " / ".join(f"{acc.get(k, 0) / MiB:.0f}" for k in ("parameters", "gradients", "optimizer", "buffers"))
        each = ", ".join(f"{r['live_peak'] / MiB:.0f}" for r in mine)
        out.append(f"| {arm} | {psi / 1e6:.1f} | {th / MiB:.0f} | {bound / MiB:.0f} | {peak / MiB:.0f} | "
                   f"{peak / (th + bound):.3f} | {each} | {rss / MiB:.0f} | {parts} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", default="")
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--dir", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.width, args.layers, args.dir)
        return 0
    folder = args.dir or tempfile.mkdtemp(prefix="zero_memory_")
    os.makedirs(folder, exist_ok=True)
    for arm in args.arms.split(","):
        cmd = [sys.executable, "-m", "ringlet.cli.main", "run", "-np", str(args.np), "--transport", "shm", "--",
               sys.executable, os.path.abspath(__file__), "--worker", arm, "--width", str(args.width),
               "--layers", str(args.layers), "--dir", folder]
        subprocess.run(cmd, check=True)
    rows = []
    for f in sorted(os.listdir(folder)):
        if f.endswith(".json"):
            with open(os.path.join(folder, f)) as fh:
                rows.append(json.load(fh))
    text = table(rows, args.np) + "\n"
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Training throughput on synthetic data: images per second per rank and in total.

    ringlet run -np 4 -- python examples/synthetic_benchmark.py --model cnn --mode hvd
    ringlet run -np 4 -- python examples/synthetic_benchmark.py --model cnn --mode ddp
    ringlet run -np 4 -- python examples/synthetic_benchmark.py --model cnn --mode stock-ddp

Modes: ``hvd`` (``ringlet.torch`` as Horovod, ``DistributedOptimizer``), ``ddp``
(``ringlet.torch.DistributedDataParallel``), ``stock-ddp`` (``torch.nn.parallel.DistributedDataParallel``
on Gloo). Models: ``cnn`` (about 2.5 M parameters, most of them in a layer whose gradient is ready early
in backward, so communication can hide behind the convolutions' backward), ``mlp`` (about 25 M
parameters: communication-bound) and ``transformer`` (3.2 M parameters in attention and MLP blocks). With ``RINGLET_TIMELINE=trace.json`` (hvd, ddp) the run writes a
trace; ``ringlet report trace.json`` then shows how much communication hid behind compute.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MODES = ("hvd", "ddp", "stock-ddp")


def cnn():
    """3x32x32 -> 10 classes; 2.47 M parameters, 2.1 M of them in the first fully connected layer."""
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(128, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(256 * 4 * 4, 512), nn.ReLU(), nn.Linear(512, 10))


def mlp():
    """3x32x32 -> 10 classes; 25.19 M parameters."""
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 4096), nn.ReLU(), nn.Linear(4096, 2048), nn.ReLU(),
                         nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))


class _Block(nn.Module):
    """A pre-norm transformer block: self-attention, then a two-layer MLP, each with a residual."""

    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class _VisionTransformer(nn.Module):
    def __init__(self, dim=256, depth=4, heads=4, patch=8):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.pos = nn.Parameter(torch.zeros(1, (32 // patch) ** 2, dim))
        self.blocks = nn.Sequential(*[_Block(dim, heads, 4 * dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.norm(self.blocks(x)).mean(dim=1))


def transformer():
    """3x32x32 -> 10 classes; a small vision transformer (16 patches of 8x8, 4 blocks of width 256,
    3.22 M parameters). Every linear layer sees batch x 16 rows, so gathering sufficient factors costs
    more than the gradient: the dense all-reduce is the path."""
    return _VisionTransformer()


MODELS = {"cnn": cnn, "mlp": mlp, "transformer": transformer}


def setup(mode, model, optimizer, ddp_options=None, hvd_groups=None):
    """Join the job in ``mode``; returns (model, optimizer, rank, size, in-place sum over ranks, finish).
    ``ddp_options``: keyword arguments for ringlet's DistributedDataParallel (mode ``ddp``);
    ``hvd_groups``: ``groups`` for the DistributedOptimizer (mode ``hvd``)."""
    if mode == "hvd":
        import ringlet.torch as hvd

        hvd.init()
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             groups=hvd_groups)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return model, optimizer, hvd.rank(), hvd.size(), lambda t: hvd.allreduce_(t, op=hvd.Sum), hvd.shutdown
    if mode == "ddp":
        import ringlet
        import ringlet.torch

        ringlet.init()
        ddp = ringlet.torch.DistributedDataParallel(model, **(ddp_options or {}))
        return ddp, optimizer, ringlet.rank(), ringlet.size(), ringlet.allreduce_, ringlet.shutdown
    import torch.distributed as dist

    dist.init_process_group("gloo")  # env:// variables come from `ringlet run` (or torchrun)
    return nn.parallel.DistributedDataParallel(model), optimizer, dist.get_rank(), dist.get_world_size(), \
        dist.all_reduce, dist.destroy_process_group


def _thread_cpu():
    """{thread id: (name, user ms, system ms, minor faults, CPU ns)} of this process, from /proc (user and
    system in kernel clock ticks, usually 10 ms; CPU ns from schedstat, 0 where the kernel lacks it)."""
    tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            ns = 0
        out[int(tid)] = (name, int(fields[11]) * tick_ms, int(fields[12]) * tick_ms, int(fields[7]), ns)
    return out


def _minor_faults():
    """Minor page faults of this process so far (Linux; 0 elsewhere): first-touch of fresh memory."""
    try:
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[7])
    except (OSError, IndexError, ValueError):
        return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn")
    parser.add_argument("--mode", choices=MODES, default="hvd")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--num-warmup-batches", type=int, default=2)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--thread-cpu", action="store_true",
                        help="also print each thread's CPU time per timed step (rank 0, Linux)")
    parser.add_argument("--hvd-groups", default="", metavar="N|buckets",
                        help="mode hvd: DistributedOptimizer groups, a number or 'buckets' (DDP's bucket layout)")
    parser.add_argument("--ddp-option", action="append", default=[], metavar="NAME=NUMBER",
                        help="a numeric keyword argument for ringlet's DistributedDataParallel (mode ddp), "
                             "e.g. bucket_cap_mb=5; repeatable")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = MODELS[args.model]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ddp_options = {k: float(v) for k, v in (o.split("=", 1) for o in args.ddp_option)}
    hvd_groups = None
    if args.hvd_groups == "buckets":  # as DDP buckets them: reverse order, 1 MB first, then 25 MB
        from ringlet.torch.training.buckets import assign_buckets

        params = list(model.parameters())
        hvd_groups = [[params[i] for i in b] for b in assign_buckets(params, 25 << 20, 1 << 20)]
    elif args.hvd_groups:
        hvd_groups = int(args.hvd_groups)
    model, optimizer, rank, size, sum_, finish = setup(args.mode, model, optimizer, ddp_options, hvd_groups)
    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 10, (args.batch_size,))

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    def log(text):
        if rank == 0:
            print(text, flush=True)

    n_params = sum(p.numel() for p in model.parameters())
    log(f"model {args.model} ({n_params / 1e6:.2f} M parameters), mode {args.mode}, batch {args.batch_size} "
        f"per rank, {size} ranks")
    for _ in range(args.num_warmup_batches):
        step()
    threads0 = _thread_cpu() if args.thread_cpu else {}
    rates = []
    cpu0, wall0, faults0 = time.process_time(), time.perf_counter(), _minor_faults()
    for i in range(args.num_iters):
        start = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            step()
        rates.append(args.batch_size * args.num_batches_per_iter / (time.perf_counter() - start))
        log(f"iter {i}: {rates[-1]:.1f} img/s per rank (rank 0)")
    steps = args.num_iters * args.num_batches_per_iter
    cpu_ms = (time.process_time() - cpu0) * 1e3 / steps
    wall_ms = (time.perf_counter() - wall0) * 1e3 / steps
    # On a host with a CPU quota a step cannot be shorter than its CPU time over the quota: this line
    # tells whether a step pays for communication's CPU or for waiting.
    faults = (_minor_faults() - faults0) / steps
    log(f"CPU per step: {cpu_ms:.1f} ms of {wall_ms:.1f} ms wall, {faults:.0f} page faults (rank 0, all threads)")
    for tid, (name, user, system, flt, _) in sorted(_thread_cpu().items()) if args.thread_cpu else ():
        _, user0, system0, flt0, _ = threads0.get(tid, (name, 0.0, 0.0, 0, 0))
        log(f"  thread {tid} {name}: user {(user - user0) / steps:.1f} ms, system {(system - system0) / steps:.1f} ms, "
            f"{(flt - flt0) / steps:.0f} page faults per step")
    mean = sum(rates) / len(rates)
    spread = 1.96 * (sum((r - mean) ** 2 for r in rates) / len(rates)) ** 0.5
    total = torch.tensor([mean], dtype=torch.float64)
    sum_(total)
    if args.mode == "ddp":
        log(f"all-reduce algorithm in use: {model.algorithm}")
    log(f"img/s per rank: {mean:.1f} +- {spread:.1f} (rank 0)")
    log(f"total img/s on {size} ranks: {total.item():.1f}")
    del model, optimizer, step
    finish()
    if args.mode == "stock-ddp":
        # torch's DDP keeps its Gloo group and the group's worker threads alive past destroy_process_group()
        # (torch 2.13, measured). A worker that drops its last reference to one of our tensors after the
        # interpreter began to shut down cannot take the GIL, and the process aborts ("terminate called
        # without an active exception"). So leave without that shutdown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()

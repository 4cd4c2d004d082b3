"""A stock torch DDP script that adds only ringlet's hook line: it calls ``dist.init_process_group``
itself and never ``ringlet.init()``. Trains a few steps with ``allreduce_hook`` and with the fp16 hook,
compares both to the same DDP without hooks, and writes ``{out}.rank{r}`` with the outcome."""
from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ringlet
import ringlet.torch.hooks as hooks


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def train(hook=None, state=None, steps: int = 4) -> torch.nn.Module:
    net = model()
    ddp = DDP(net, bucket_cap_mb=0.0001)  # several buckets
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(steps):
        opt.zero_grad()
        ddp(torch.randn(5, 8, generator=g)).square().sum().backward()
        opt.step()
    return net


def maxdiff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def main() -> int:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    state = hooks.HookState()
    hooked = train(hooks.allreduce_hook, state)
    plain = train()
    fp16 = train(hooks.fp16_compress_hook, hooks.HookState())
    result = {"rank": dist.get_rank(), "hook_vs_stock": maxdiff(hooked, plain), "fp16_vs_stock": maxdiff(fp16, plain),
              "bucket_calls": {i: b.calls for i, b in state.buckets.items()},
              "transport": ringlet.collectives.runtime().transport.name}
    with open(f"{out}.rank{dist.get_rank()}", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

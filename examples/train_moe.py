"""A small transformer on scikit-learn's digits with mixture-of-experts feed-forward layers, against its
dense counterpart at equal compute per token.

    ringlet run -np 4 -- python examples/train_moe.py --epochs 3
    ringlet run -np 2 -- python examples/train_moe.py --epochs 1 --arms moe --experts 4 --k 2

Each 8x8 image is a sequence of 8 tokens (its rows). Every block is attention then a feed-forward layer:
in the dense arm an MLP of width ``--ff``; in the MoE arm ``ringlet.torch.MoE`` with ``--experts`` experts
spread over the ranks (``--ep-size``, default all of them), each an MLP of width ``--ff / k``, so a
token costs the same multiply-adds in both arms (top-1: one expert of the full width; top-2: two of
half width). The dense arm trains under ringlet's ``DistributedDataParallel``, the MoE arm under
``ringlet.torch.moe_parallel`` (experts averaged over their replicas only). Both arms run in one job,
one after the other, from the same data order. For each arm rank 0 prints the training throughput, the
test accuracy, the parameters held per rank and, for MoE, the expert load balance (the busiest
expert's share of the routed tokens over the mean share: 1.0 is perfectly even) and the share of
assignments dropped for capacity (``--json PATH`` writes the same as JSON). Nothing is downloaded
(``pip install scikit-learn``).
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import ringlet
import ringlet.torch

from digits_data import configuration, digits  # examples/digits_data.py, beside this script


class Block(torch.nn.Module):
    """Pre-norm attention and feed-forward (an MLP, or an MoE layer when ``moe`` holds its options)."""

    def __init__(self, d: int, heads: int, ff: int, moe: dict | None, seed: int = 0):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        width = ff if moe is None else ff // moe["k"]
        mlp = torch.nn.Sequential(torch.nn.Linear(d, width), torch.nn.GELU(), torch.nn.Linear(width, d))
        # MoE's seed fixes its gate and experts: one per block, or every block would start identical
        self.ffn = mlp if moe is None else ringlet.torch.MoE(d, mlp, **moe, seed=seed)

    def forward(self, x: torch.Tensor, aux: list) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        h = self.norm2(x)
        if isinstance(self.ffn, ringlet.torch.MoE):
            y, loss = self.ffn(h)
            aux.append(loss)
        else:
            y = self.ffn(h)
        return x + y


class Net(torch.nn.Module):
    """Rows of the image as tokens, ``layers`` blocks, mean over tokens, 10 classes. Returns
    ``(logits, aux)``: ``aux`` the sum of the MoE layers' load-balancing losses (0 when dense)."""

    def __init__(self, d: int, heads: int, ff: int, layers: int, moe: dict | None):
        super().__init__()
        self.embed = torch.nn.Linear(8, d)
        self.pos = torch.nn.Parameter(torch.randn(8, d) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(d, heads, ff, moe, seed=i) for i in range(layers))
        self.head = torch.nn.Linear(d, 10)

    def forward(self, x: torch.Tensor):
        h = self.embed(x.view(-1, 8, 8)) + self.pos
        aux: list = []
        for block in self.blocks:
            h = block(h, aux)
        return self.head(h.mean(dim=1)), sum(aux) if aux else torch.zeros(())

    def moe_layers(self) -> list:
        return [b.ffn for b in self.blocks if isinstance(b.ffn, ringlet.torch.MoE)]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--d", type=int, default=32, help="model width")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ff", type=int, default=64, help="feed-forward width of the dense arm")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=None, help="experts per MoE layer (default 2 per rank)")
    parser.add_argument("--ep-size", type=int, default=None, help="ranks sharing the experts (default all)")
    parser.add_argument("--k", type=int, default=1, choices=(1, 2))
    parser.add_argument("--capacity-factor", type=float, default=1.25)
    parser.add_argument("--aux", type=float, default=0.01, help="weight of the load-balancing loss")
    parser.add_argument("--arms", default="dense,moe", help="comma-separated: dense, moe")
    parser.add_argument("--json", default=None, help="also write rank 0's results to this file")
    return parser.parse_args()


def build(arm: str, args, world: int):
    """The arm's wrapped model and its unwrapped net."""
    moe = None
    if arm == "moe":
        moe = dict(num_experts=args.experts or 2 * world, ep_size=args.ep_size, k=args.k,
                   capacity_factor=args.capacity_factor)
    torch.manual_seed(0)
    net = Net(args.d, args.heads, args.ff, args.layers, moe)
    model = ringlet.torch.moe_parallel(net) if moe else ringlet.torch.DistributedDataParallel(net)
    return model, net


def train(model, net, args, loader, sampler) -> tuple[float, torch.Tensor]:
    """Train; returns (seconds, [tokens, assignments, dropped, load per expert...] summed over layers)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    layers = net.moe_layers()
    counts = torch.zeros(3 + (layers[0].num_experts if layers else 0), dtype=torch.float64)
    ringlet.barrier()
    start = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            logits, aux = model(x)
            (F.cross_entropy(logits, y) + args.aux * aux).backward()
            optimizer.step()
            for m in layers:
                s = m.stats
                counts += torch.tensor([s["tokens"], s["tokens"] * m.k, s["dropped"], *s["load"]], dtype=torch.float64)
    ringlet.barrier()
    return time.perf_counter() - start, counts


def accuracy(model, test_set, rank: int, world: int) -> float:
    sampler = DistributedSampler(test_set, num_replicas=world, rank=rank, shuffle=False)  # same batches per rank
    right = torch.zeros(2, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for x, y in DataLoader(test_set, batch_size=128, sampler=sampler):
            right += torch.tensor([(model(x)[0].argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
    ringlet.allreduce_(right)
    return (right[0] / right[1]).item()


def run_arm(arm: str, args, rank: int, world: int, train_set, test_set) -> dict | None:
    """Train and test one arm; rank 0 prints its line and returns its results (others: None)."""
    model, net = build(arm, args, world)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, seed=0)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    seconds, counts = train(model, net, args, loader, sampler)
    ringlet.allreduce_(counts)
    acc = accuracy(model, test_set, rank, world)
    params = sum(p.numel() for p in net.parameters())
    if rank != 0:
        return None
    res = {"arm": arm, "ranks": world, "samples_per_s": len(sampler) * world * args.epochs / seconds,
           "test_accuracy": acc, "parameters_per_rank": params}
    line = (f"{arm:5s}: {res['samples_per_s']:8.1f} samples/s  test accuracy {acc:.4f}  "
            f"parameters per rank {params}")
    if counts.numel() > 3:
        load = counts[3:]
        res.update(load_balance=(load.max() / load.mean()).item(), dropped_share=(counts[2] / counts[1]).item(),
                   load=load.tolist())
        line += f"  load balance {res['load_balance']:.2f}  dropped {res['dropped_share']:.2%}"
    print(line, flush=True)
    return res


def main():
    args = parse_args()
    ringlet.init()
    rank, world = ringlet.rank(), ringlet.size()
    torch.set_num_threads(1)  # ranks share this machine's cores
    if rank == 0:
        print(f"configuration: {configuration()}; {world} ranks, {args.epochs} epochs, k={args.k}, "
              f"capacity factor {args.capacity_factor}", flush=True)
    train_set, test_set = digits()
    arms = args.arms.split(",")
    for arm in arms:
        if arm not in ("dense", "moe"):
            raise SystemExit(f"unknown arm {arm!r}: use dense and/or moe")
    results = [run_arm(arm, args, rank, world, train_set, test_set) for arm in arms]
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    ringlet.shutdown()


if __name__ == "__main__":
    main()

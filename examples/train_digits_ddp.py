"""Train a small classifier on scikit-learn's handwritten digits with ringlet's DistributedDataParallel.

    ringlet run -np 4 -- python examples/train_digits_ddp.py --epochs 5
    ringlet run -np 4 -- python examples/train_digits_ddp.py --epochs 5 --stock   # torch's DDP on Gloo

A torch DDP script moves to ringlet by calling ``ringlet.init()`` instead of
``torch.distributed.init_process_group`` and wrapping the model in ``ringlet.torch.DistributedDataParallel``
instead of ``torch.nn.parallel.DistributedDataParallel``; ``--stock`` keeps torch's, for comparison.
The data set ships inside scikit-learn (``pip install scikit-learn``), so nothing is downloaded.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import ringlet
import ringlet.torch

from digits_data import configuration, digits  # examples/digits_data.py, beside this script


def setup(stock: bool):
    """(rank, world size, in-place sum all-reduce, DDP class) of torch.distributed or of ringlet."""
    if stock:  # env:// variables come from `ringlet run` (or torchrun)
        dist.init_process_group("gloo")
        return dist.get_rank(), dist.get_world_size(), dist.all_reduce, torch.nn.parallel.DistributedDataParallel
    ringlet.init()
    return ringlet.rank(), ringlet.size(), ringlet.allreduce_, ringlet.torch.DistributedDataParallel


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by the number of ranks")
    parser.add_argument("--stock", action="store_true", help="torch.nn.parallel.DistributedDataParallel on Gloo")
    return parser.parse_args()


def main():
    args = parse_args()

    rank, world, all_reduce, DDP = setup(args.stock)
    if rank == 0:
        print(f"configuration: {configuration()}", flush=True)
    torch.set_num_threads(1)  # ranks share this machine's cores
    torch.manual_seed(0)

    train_set, test_set = digits()
    train_sampler = DistributedSampler(train_set, num_replicas=world, rank=rank)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = DistributedSampler(test_set, num_replicas=world, rank=rank, shuffle=False)
    test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler)

    # DDP starts every rank from rank 0's weights and averages the gradients during backward().
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * world, momentum=0.9)

    start = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        train_sampler.set_epoch(epoch)
        loss_sum = torch.zeros(1)
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
        all_reduce(loss_sum)  # sum over ranks, in place
        if rank == 0:
            print(f"epoch {epoch + 1}: train loss {loss_sum.item() / (world * len(train_loader)):.4f}", flush=True)
    seconds = time.perf_counter() - start  # the last all-reduce above waited for every rank
    samples = len(train_sampler) * world * args.epochs

    model.eval()
    counts = torch.zeros(2)  # [right, seen] on this rank
    with torch.no_grad():
        for x, y in test_loader:
            counts += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
    all_reduce(counts)
    right, seen = counts.tolist()
    if rank == 0:
        print(f"test accuracy: {right / seen:.4f}  throughput: {samples / seconds:.1f} samples/s  "
              f"({world} ranks, {args.epochs} epochs, {seconds:.2f} s)")
    if args.stock:
        # torch's DDP keeps its Gloo group and the group's worker threads alive past destroy_process_group()
        # (torch 2.13, measured). If a worker drops its last reference to one of our tensors after the
        # interpreter began to shut down, it cannot take the GIL and the process aborts ("terminate called
        # without an active exception", about 1 run in 8 on 2 busy cores). So leave without that shutdown.
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    ringlet.shutdown()


if __name__ == "__main__":
    main()

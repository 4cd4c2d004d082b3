"""Train a small classifier on scikit-learn's handwritten digits with ringlet's Horovod-compatible API.

    ringlet run -np 4 -- python examples/train_digits_hvd.py --epochs 5

Written as for Horovod: with ``import horovod.torch as hvd`` instead of ``import ringlet.torch as hvd``
(and ``horovodrun`` instead of ``ringlet run``) the script runs unchanged on Horovod. The data set ships
inside scikit-learn (``pip install scikit-learn``), so nothing is downloaded.
"""
import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import ringlet.torch as hvd

from digits_data import configuration, digits  # examples/digits_data.py, beside this script


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by the number of ranks")
    args = parser.parse_args()

    hvd.init()
    if hvd.rank() == 0:
        print(f"configuration: {configuration()}", flush=True)
    torch.set_num_threads(1)  # ranks share this machine's cores
    torch.manual_seed(0)

    train_set, test_set = digits()
    # Each rank trains on its own shard of every epoch.
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler)

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    # The effective batch is size() times larger, so is the learning rate.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    # Start every rank from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    start = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        train_sampler.set_epoch(epoch)
        loss_sum = 0.0
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
        # hvd.allreduce averages by default: the mean training loss over all ranks.
        loss_avg = hvd.allreduce(torch.tensor(loss_sum / len(train_loader)), name="train_loss").item()
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}: train loss {loss_avg:.4f}", flush=True)
    seconds = time.perf_counter() - start  # the last all-reduce above waited for every rank
    samples = len(train_sampler) * hvd.size() * args.epochs

    model.eval()
    correct = torch.zeros(2)  # [right, seen] on this rank
    with torch.no_grad():
        for x, y in test_loader:
            correct += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
    right, seen = hvd.allreduce(correct, op=hvd.Sum, name="test_counts").tolist()
    if hvd.rank() == 0:
        print(f"test accuracy: {right / seen:.4f}  throughput: {samples / seconds:.1f} samples/s  "
              f"({hvd.size()} ranks, {args.epochs} epochs, {seconds:.2f} s)")
    hvd.shutdown()


if __name__ == "__main__":
    main()

"""The digits classifier on a Ray cluster: Horovod-style on ringlet's RayExecutor, or ringlet's DDP under
Ray Train's TorchTrainer. The training matches examples/train_digits_hvd.py and train_digits_ddp.py, so
the same number of workers reaches the same accuracy as ``ringlet run -np N`` does.

    python examples/ray_digits.py --workers 2                 # RayExecutor, hvd-style
    python examples/ray_digits.py --workers 2 --trainer       # TorchTrainer, ringlet's DDP
    python examples/ray_digits.py --workers 2 --address auto  # on a running Ray cluster

Needs ``pip install 'ringlet[ray,examples]'``.
"""
import argparse
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # digits_data, in the workers too
from digits_data import digits  # noqa: E402


def _model():
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def _loaders(rank, world, batch_size):
    train_set, test_set = digits()
    train_sampler = DistributedSampler(train_set, num_replicas=world, rank=rank)
    test_sampler = DistributedSampler(test_set, num_replicas=world, rank=rank, shuffle=False)
    return (train_sampler, DataLoader(train_set, batch_size=batch_size, sampler=train_sampler),
            DataLoader(test_set, batch_size=256, sampler=test_sampler))


def _epoch(model, optimizer, sampler, loader, epoch):
    model.train()
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def _counts(model, loader):
    model.eval()
    counts = torch.zeros(2)  # [right, seen] on this rank
    with torch.no_grad():
        for x, y in loader:
            counts += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
    return counts


def train_hvd(epochs=5, batch_size=32, lr=0.05):
    """One RayExecutor worker: train as examples/train_digits_hvd.py does; the test accuracy (every rank)."""
    import ringlet.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    sampler, train_loader, test_loader = _loaders(hvd.rank(), hvd.size(), batch_size)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for epoch in range(epochs):
        _epoch(model, optimizer, sampler, train_loader, epoch)
    right, seen = hvd.allreduce(_counts(model, test_loader), op=hvd.Sum, name="test_counts").tolist()
    hvd.shutdown()
    return right / seen


def train_ddp(config):
    """One Ray Train worker: ``ringlet.init()`` adopts the process group Ray Train made; ringlet's DDP as
    in examples/train_digits_ddp.py; reports the test accuracy."""
    import ray.train

    import ringlet
    import ringlet.torch

    ringlet.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank, world = ringlet.rank(), ringlet.size()
    sampler, train_loader, test_loader = _loaders(rank, world, config.get("batch_size", 32))
    model = ringlet.torch.DistributedDataParallel(_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.05) * world, momentum=0.9)
    for epoch in range(config.get("epochs", 5)):
        _epoch(model, optimizer, sampler, train_loader, epoch)
    counts = ringlet.allreduce_(_counts(model, test_loader))
    ringlet.shutdown()
    metrics = {"accuracy": counts[0].item() / counts[1].item(), "world": world}
    with tempfile.TemporaryDirectory() as folder:  # Ray Train keeps the metrics of reports with a checkpoint
        checkpoint = None
        if rank == 0:
            torch.save(model.module.state_dict(), os.path.join(folder, "model.pt"))
            checkpoint = ray.train.Checkpoint.from_directory(folder)
        ray.train.report(metrics, checkpoint=checkpoint)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--address", default=None, help="a running Ray cluster (auto, or HOST:PORT)")
    parser.add_argument("--trainer", action="store_true", help="Ray Train's TorchTrainer with ringlet's DDP")
    parser.add_argument("--storage", default="/tmp/ringlet-ray-results", help="Ray Train's storage_path")
    args = parser.parse_args()
    import ray

    ray.init(address=args.address)
    if args.trainer:
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        trainer = TorchTrainer(train_ddp, train_loop_config={"epochs": args.epochs},
                               scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
                               run_config=RunConfig(storage_path=args.storage))
        accuracy = trainer.fit().metrics["accuracy"]
    else:
        from ringlet.ray import RayExecutor

        executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=args.workers)
        executor.start()
        accuracy = executor.run(train_hvd, kwargs={"epochs": args.epochs})[0]
        print(f"ranks' hosts: {executor.hosts}")
        executor.shutdown()
    print(f"test accuracy: {accuracy:.4f}  ({args.workers} workers, {args.epochs} epochs, "
          f"{'TorchTrainer' if args.trainer else 'RayExecutor'})")


if __name__ == "__main__":
    main()

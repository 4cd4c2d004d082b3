"""Elastic training on scikit-learn's digits with ringlet's Horovod-compatible API: survives a dying worker.

    ringlet run --elastic -np 3 --min-np 2 -- python examples/train_digits_elastic.py --kill-rank 2 --kill-step 20
    ringlet run --elastic -np 3 --min-np 2 --restarts 1 -- python examples/train_digits_elastic.py --kill-rank 2 --kill-step 20 --epochs 5 --step-sleep 0.1

The rank ``--kill-rank`` exits (status 1) at global step ``--kill-step`` of the first membership; the
others restore the last commit, continue as 2 ranks and, with ``--restarts 1``, take a replacement worker
in at a later commit (``--step-sleep`` stands for a bigger model: it gives the replacement time to start).
Written as for Horovod elastic (``import horovod.torch as hvd``, ``horovodrun --min-np``): ``TorchState`` +
``ElasticSampler`` + ``@hvd.elastic.run`` + ``state.commit()``. Runs under plain ``ringlet run -np 2`` too.
"""
import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import ringlet.torch as hvd

from digits_data import digits  # examples/digits_data.py, beside this script


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by the number of ranks")
    parser.add_argument("--batches-per-commit", type=int, default=1)
    parser.add_argument("--kill-rank", type=int, default=None, help="this rank exits at --kill-step")
    parser.add_argument("--kill-step", type=int, default=10)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of extra work per step")
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(1)  # ranks share this machine's cores
    torch.manual_seed(0)
    first_size = hvd.size()
    train_set, test_set = digits()
    train_sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=0)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, train_sampler=train_sampler,
                                   epoch=0, step=0)

    def on_reset():
        # The effective batch follows the number of ranks; so does the learning rate.
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()
        if hvd.rank() == 0:
            print(f"reset: now {hvd.size()} ranks, resuming at epoch {state.epoch} step {state.step}", flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            model.train()
            loss_sum, batches = 0.0, 0
            for batch_idx, (x, y) in enumerate(train_loader):
                if (args.kill_rank == hvd.rank() and state.step == args.kill_step
                        and hvd.size() == first_size and os.environ.get("RINGLET_ELASTIC")):
                    print(f"rank {hvd.rank()}: exiting at step {state.step} (--kill-rank)", flush=True)
                    os._exit(1)
                time.sleep(args.step_sleep)
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                train_sampler.record_batch(batch_idx, args.batch_size)
                state.step += 1
                loss_sum, batches = loss_sum + loss.item(), batches + 1
                if state.step % args.batches_per_commit == 0:
                    state.commit()
            loss_avg = hvd.allreduce(torch.tensor(loss_sum / max(1, batches)), name="train_loss").item()
            if hvd.rank() == 0:
                print(f"epoch {state.epoch + 1}: train loss {loss_avg:.4f} ({hvd.size()} ranks)", flush=True)
            state.epoch += 1
            train_sampler.set_epoch(state.epoch)
            state.commit()

    train(state)

    model.eval()
    test_sampler = hvd.elastic.ElasticSampler(test_set, shuffle=False)
    correct = torch.zeros(2)  # [right, seen] on this rank (padding may count a few samples twice)
    with torch.no_grad():
        for x, y in DataLoader(test_set, batch_size=256, sampler=test_sampler):
            correct += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
    right, seen = hvd.allreduce(correct, op=hvd.Sum, name="test_counts").tolist()
    if hvd.rank() == 0:
        print(f"test accuracy: {right / seen:.4f} ({hvd.size()} ranks at the end, {state.step} steps)")
    hvd.shutdown()


if __name__ == "__main__":
    main()

"""A Horovod elastic training script for tests/multiproc/test_elastic.py (runs unchanged under plain
``ringlet run`` too).

A linear model on a synthetic data set of ``--samples`` rows, an ``ElasticSampler``, a commit after
every step. Before each commit every rank appends what it is about to commit to ``OUT/w<id>.jsonl``
(its own batch indices, generation, rank, size, epoch): a batch is committed exactly when its line
exists, since ``commit()`` saves before anything in it can fail. At the end every rank writes its
parameters to ``OUT/final-w<id>.json``.

Fault injection (environment, so that the command line stays the same for every worker):
``ELASTIC_KILL=RANK:STEP[:STATUS]``: in generation 0, the rank ``RANK`` calls ``os._exit(STATUS)``
(default 1) at the start of global step ``STEP``. ``ELASTIC_KILL_MODE=allreduce``: instead, every rank starts a large
all-reduce at that step and the victim dies ~0.2 s into it (inside the ring some survivors then wait
on a peer that is alive, which must release them). ``ELASTIC_KILL_MODE=stop``: the victim stops itself with SIGSTOP instead (a silent peer). ``ELASTIC_SLOW_BELOW=N``: sleep 0.2 s per step while fewer
than N ranks train (gives a replacement worker time to join).
"""
import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import ringlet.torch as hvd
from ringlet.elastic import rendezvous


def generation() -> int:
    a = rendezvous.current()
    return a.generation if a is not None else 0


def worker_id() -> str:
    return os.environ.get("RINGLET_ELASTIC_ID", str(hvd.rank()))


def maybe_die(step: int) -> None:
    spec = os.environ.get("ELASTIC_KILL")
    if not spec or generation() != 0:
        return
    parts = [int(x) for x in spec.split(":")]
    rank, at, status = parts[0], parts[1], parts[2] if len(parts) > 2 else 1
    if step != at:
        return
    if os.environ.get("ELASTIC_KILL_MODE") == "stop":
        if hvd.rank() == rank:
            os.kill(os.getpid(), signal.SIGSTOP)  # silent, not dead: only the liveness monitor can tell
    elif os.environ.get("ELASTIC_KILL_MODE") == "allreduce":
        if hvd.rank() == rank:
            threading.Timer(0.2, lambda: os._exit(status)).start()
        # Every rank: 64 MiB keep the ring busy well past 0.2 s, so the victim dies inside it.
        hvd.allreduce(torch.ones(16 << 20), name="big")
        if hvd.rank() == rank:
            time.sleep(30)  # only if the all-reduce beat the timer
    elif hvd.rank() == rank:
        os._exit(status)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--samples", type=int, default=48)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    out = Path(args.out)

    hvd.init()
    torch.manual_seed(0)
    x = torch.randn(args.samples, 8)
    y = (x.sum(1) > 0).long()
    dataset = torch.utils.data.TensorDataset(x, y)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=1)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(hvd.rank())  # different initial weights: sync must make them equal
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, sampler=sampler, epoch=0, step=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    slow_below = int(os.environ.get("ELASTIC_SLOW_BELOW", "0"))

    def log(rec):
        with open(out / f"w{worker_id()}.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            for batch_idx, (data, target) in enumerate(loader):
                maybe_die(state.step)
                if hvd.size() < slow_below:
                    time.sleep(0.2)
                opt.zero_grad()
                F.cross_entropy(model(data), target).backward()
                opt.step()
                sampler.record_batch(batch_idx, args.batch_size)
                state.step += 1
                log({"gen": generation(), "rank": hvd.rank(), "size": hvd.size(), "epoch": state.epoch,
                     "step": state.step, "indices": sampler.get_indices(batch_idx, args.batch_size)})
                state.commit()
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    final = {"wid": worker_id(), "rank": hvd.rank(), "size": hvd.size(), "gen": generation(), "resets": resets,
             "step": state.step, "params": [v.flatten().tolist() for _, v in sorted(model.state_dict().items())]}
    (out / f"final-w{worker_id()}.json").write_text(json.dumps(final))
    hvd.shutdown()


if __name__ == "__main__":
    main()

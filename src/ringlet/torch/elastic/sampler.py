"""``ElasticSampler``: each sample of an epoch once, even when the number of ranks changes mid-epoch."""
from __future__ import annotations

import math
import random

import torch.utils.data

from .. import basics


class ElasticSampler(torch.utils.data.Sampler):
    """Partition the samples of the current epoch that are not processed yet over the current ranks.

    The epoch's order is ``range(len(dataset))``, shuffled with ``random.Random(seed + epoch)`` when
    ``shuffle``; samples recorded as processed (:meth:`record_batch`, :meth:`record_indices`) are left
    out; the rest is padded (cyclically) to a multiple of ``size()`` so that every rank gets the same
    number of samples (as Horovod and ``DistributedSampler`` do: ranks step in lockstep), and rank
    ``r`` takes every ``size()``-th one from ``r``. :meth:`reset` re-reads ``rank()``/``size()`` and
    re-splits what remains, so after a membership change the survivors share the rest of the epoch.
    The state (epoch, processed indices) travels through :meth:`state_dict` / :meth:`load_state_dict`,
    which is how ``TorchState`` commits, restores and syncs it.
    """

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.indices: list[int] = []
        self._padded: list[int] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: nothing is processed yet; new order when shuffling."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark batch ``batch_idx`` (of ``batch_size`` samples, counted from the start of the current
        iteration) as processed *on every rank*: in data-parallel training a step that completed its
        gradient all-reduce has consumed that batch everywhere, so every rank records the same set."""
        lo, hi = batch_idx * batch_size, (batch_idx + 1) * batch_size
        for r in range(self.num_replicas):
            self.record_indices(self._padded[r:self.total_size:self.num_replicas][lo:hi])

    def record_indices(self, indices) -> None:
        """Mark ``indices`` (dataset indices) as processed."""
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This rank's dataset indices of batch ``batch_idx`` of the current iteration."""
        return self.indices[batch_idx * batch_size:(batch_idx + 1) * batch_size]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epoch = int(state_dict["epoch"])
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self) -> None:
        """Re-read the rank and size (1 rank before ``hvd.init()``) and re-split the remaining samples."""
        if basics.is_initialized():
            self.num_replicas, self.rank = basics.size(), basics.rank()
        else:
            self.num_replicas, self.rank = 1, 0
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        padded = list(self.remaining_indices)
        while padded and len(padded) < self.total_size:
            padded += self.remaining_indices[:self.total_size - len(padded)]
        self._padded = padded
        self.indices = padded[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        return iter(list(self.indices))

    def __len__(self) -> int:
        return self.num_samples

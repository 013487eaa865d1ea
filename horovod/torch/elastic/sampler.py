"""`ElasticSampler`: each rank's share of an epoch, resumable after a change of membership.

The epoch's order is fixed by `seed + epoch` (the same on every rank). Progress is one number,
`processed_num`: how many positions of that order the job as a whole has consumed. Positions are
dealt round-robin (`order[processed_num + rank :: size]`), so after `k` full steps of batch `b`
on `n` ranks exactly the first `k*b*n` positions are done, whatever `n` was at each step. A
reset deals the rest among the new ranks: nothing committed is repeated, nothing is skipped.
Like Horovod's and torch's DistributedSampler, the last step of an epoch is padded with
repeats from the start of the remaining order so every rank has the same number of samples.
"""

from __future__ import annotations

import math
from typing import Iterator, Sized

import torch
import torch.utils.data

from horovod.common import basics


class ElasticSampler(torch.utils.data.Sampler):
    """A sampler that shards `dataset` over the current ranks and, after the job changes size,
    over the new ones, skipping the samples already processed this epoch (`record_batch`)."""

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` from its beginning (its own shuffle)."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Every rank finished a batch of `batch_size` samples."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices: list[int]) -> None:
        """Every rank finished as many samples as `indices` holds."""
        self.record_batch(0, len(indices))

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Deal what is left of the epoch among the current ranks."""
        self.num_replicas = basics.size() if basics.is_initialized() else 1
        self.rank = basics.rank() if basics.is_initialized() else 0
        self.remaining_indices = self._order()[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.dataset)))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.dataset), generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        indices = list(self.remaining_indices)
        if indices:
            indices += (indices * math.ceil(self.total_size / len(indices)))[:self.total_size - len(indices)]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

"""The training dataloader initialize() builds from `training_data`: micro-batch sized, with a
DistributedSampler over the data-parallel ranks (DeepSpeed's deepspeed_io)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, DistributedSampler

from . import comm


def make_dataloader(
    dataset,
    cfg,
    collate_fn=None,
    group=None,
    batch_size=None,
    data_sampler=None,
    num_workers: int = 0,
) -> DataLoader:
    world = comm.get_world_size(group)
    sampler = data_sampler
    if sampler is None and world > 1:
        sampler = DistributedSampler(
            dataset, num_replicas=world, rank=comm.get_rank(group), shuffle=False
        )
    return DataLoader(
        dataset,
        batch_size=batch_size or cfg.train_micro_batch_size_per_gpu,
        sampler=sampler,
        collate_fn=collate_fn,
        drop_last=cfg.dataloader_drop_last,
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available(),
    )


class RepeatingLoader:
    """DeepSpeed's endless iterator over a loader: `next()` starts the loader again where it
    ends, so a training loop can draw batches by step count instead of by epoch. A
    DistributedSampler in it is moved to its next epoch at each restart (its shuffle order
    changes as it would between epochs)."""

    def __init__(self, loader):
        self.loader = loader
        self._epoch = 0
        self.data_iter = iter(self.loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self._epoch += 1
            sampler = getattr(self.loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(self._epoch)
            self.data_iter = iter(self.loader)
            return next(self.data_iter)

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

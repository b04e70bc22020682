"""deepspeed.runtime.utils.PartitionedTensor: each rank keeps partition_uniform's piece of
the flattened tensor, full() gathers the original back (uneven pieces too), and the meta
tensor (DeepSpeed's [ndims, *size, parts, rank, *boundaries]) rebuilds the same object from
a rank's piece. 3 ranks, so DeepSpeed's own 4-rank cases' logic runs on 2 cores."""

import pytest
import torch

from multirank import run_ranks


def worker(rank, world):
    from deepspeed.runtime.utils import PartitionedTensor, partition_uniform

    from zerostream import comm

    comm.init_distributed(dist_backend="gloo")
    full = torch.arange(7 * 4, dtype=torch.float32).reshape(7, 4)  # 28 over 3: 10, 9, 9
    part = PartitionedTensor(full, group=None)
    bounds = partition_uniform(full.numel(), world)
    mine = torch.equal(part.data(), full.reshape(-1)[bounds[rank] : bounds[rank + 1]])
    meta = part.to_meta()
    again = PartitionedTensor.from_meta(meta, part.local_data, None)
    with pytest.raises(ValueError, match="torch.long"):
        PartitionedTensor.from_meta(meta.float(), part.local_data, None)
    return mine, part.local_size(), part.full(), again.full(), meta.tolist()


def test_pieces_gather_back_and_the_meta_rebuilds_them():
    full = torch.arange(28, dtype=torch.float32).reshape(7, 4)
    for rank, (mine, size, whole, again, meta) in enumerate(run_ranks(worker, 3)):
        assert mine and size == torch.Size([[10, 9, 9][rank]])
        assert torch.equal(whole, full) and torch.equal(again, full)
        assert meta == [2, 7, 4, 3, rank, 0, 10, 19, 28]

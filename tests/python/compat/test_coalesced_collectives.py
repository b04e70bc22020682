"""deepspeed.runtime.comm.coalesced_collectives.reduce_scatter_coalesced: rank r gets chunk r
(ceil(numel / world) elements, the last ones shorter or empty) of every tensor, averaged over
the ranks, from one reduce-scatter. Checked against the chunks of the ranks' inputs averaged
by hand, at 2 and 3 ranks, with sizes that leave chunks short and empty."""

import pytest
import torch

from multirank import run_ranks

SIZES = [6, 3, 1, 7]


def _inputs(rank):
    g = torch.Generator().manual_seed(rank)
    return [torch.randn(n, generator=g) for n in SIZES]


def worker(rank, world):
    from deepspeed.runtime.comm.coalesced_collectives import (
        all_to_all_quant_reduce,
        reduce_scatter_coalesced,
    )

    from zerostream import comm

    comm.init_distributed(dist_backend="gloo")
    inputs = _inputs(rank)
    before = [t.clone() for t in inputs]
    out = reduce_scatter_coalesced(inputs, comm.get_world_group())
    unchanged = all(torch.equal(a, b) for a, b in zip(inputs, before))
    with pytest.raises(NotImplementedError, match="zero_quantized_gradients"):
        all_to_all_quant_reduce(inputs, {})
    with pytest.raises(ValueError, match="tensor 1 is torch.float64"):
        reduce_scatter_coalesced([inputs[0], inputs[1].double()])
    return out, unchanged


@pytest.mark.parametrize("world", [2, 3])
def test_each_rank_gets_its_chunk_of_every_tensor_averaged(world):
    mean = [sum(ts) / world for ts in zip(*(_inputs(r) for r in range(world)))]
    for rank, (out, unchanged) in enumerate(run_ranks(worker, world)):
        assert unchanged  # the inputs are the caller's: not reduced in place
        for n, got, want in zip(SIZES, out, mean):
            chunk = -(-n // world)
            torch.testing.assert_close(got, want[rank * chunk : (rank + 1) * chunk])

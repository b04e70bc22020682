"""The collectives DeepSpeed's `deepspeed.comm` has that zerostream.comm gained for the
compatibility package, on 2 Gloo ranks, against what each must compute."""

import pytest
import torch

from multirank import run_ranks


def comm_worker(rank, world):
    from zerostream import comm

    comm.init_distributed()
    out = {"available": comm.is_available(), "ranks": comm.get_all_ranks_from_group()}
    # reduce_scatter: output = sum over ranks of input_list[this rank].
    inputs = [torch.full((3,), float(10 * rank + j)) for j in range(world)]
    rs = torch.empty(3)
    comm.reduce_scatter(rs, inputs)
    out["reduce_scatter"] = rs
    # inference_all_reduce: in place, the sum, the tensor returned.
    t = torch.full((2,), float(rank + 1))
    out["inference_all_reduce"] = (comm.inference_all_reduce(t) is t, t)
    # all_reduce_coalesced: each tensor summed, shapes kept.
    a, b = torch.full((2, 2), float(rank + 1)), torch.arange(3.0) * (rank + 1)
    comm.all_reduce_coalesced([a, b])
    out["coalesced"] = (a, b)
    # Mixed dtypes keep theirs (an int64 count beside bf16 values: neither promoted), and
    # async_op returns a handle: the tensors hold the sums once it is waited on.
    c = torch.tensor([2**40 + rank], dtype=torch.int64)
    d = torch.full((3,), 0.1 * (rank + 1), dtype=torch.bfloat16)
    handle = comm.all_reduce_coalesced([c, d], async_op=True)
    out["async_handle"] = handle is not None
    handle.wait()
    out["mixed"] = (c, d)
    # all_to_all: output[j] = rank j's input[this rank].
    send = [torch.tensor([100.0 * rank + j]) for j in range(world)]
    recv = [torch.empty(1) for _ in range(world)]
    try:
        comm.all_to_all(recv, send)
        out["all_to_all"] = recv
    except RuntimeError as exc:  # the backend may lack it; the test says so
        out["all_to_all"] = str(exc)
    return out


@pytest.mark.multirank
def test_added_collectives_compute_what_deepspeed_comm_does():
    world = 2
    results = run_ranks(comm_worker, world, timeout=120)
    for rank, out in enumerate(results):
        assert out["available"] and out["ranks"] == [0, 1]
        expected = sum(10 * r + rank for r in range(world))
        torch.testing.assert_close(out["reduce_scatter"], torch.full((3,), float(expected)))
        same, summed = out["inference_all_reduce"]
        assert same and torch.equal(summed, torch.full((2,), 3.0))
        a, b = out["coalesced"]
        torch.testing.assert_close(a, torch.full((2, 2), 3.0))
        torch.testing.assert_close(b, torch.arange(3.0) * 3)
        c, d = out["mixed"]
        assert out["async_handle"] and c.dtype == torch.int64 and d.dtype == torch.bfloat16
        assert int(c) == 2 * 2**40 + 1  # exact: an fp32/bf16 promotion would lose it
        want = torch.full((3,), 0.1, dtype=torch.bfloat16) + torch.full(
            (3,), 0.2, dtype=torch.bfloat16
        )
        assert torch.equal(d, want)
        if isinstance(out["all_to_all"], str):
            pytest.skip(f"this torch's Gloo has no all_to_all: {out['all_to_all']}")
        torch.testing.assert_close(
            torch.cat(out["all_to_all"]), torch.tensor([100.0 * r + rank for r in range(world)])
        )

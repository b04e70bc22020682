"""The ranks' agreements on the host (Note [Agreements on the host] in
zerostream/comm/host_agreement.py): a group that reduces CPU tensors serves itself; an
NCCL-only one gets a Gloo twin when the engine is built, used only if every rank made it;
one never prepared keeps the device path. NCCL is stood in for by a Gloo world whose backend
is reported as "nccl" (this machine has no GPU); the twin really is a second Gloo group.

That the step's agreements then read no device memory is test_gpu_path.py's step budget (on
the simulated device: the late-part flags and stage 3's rounds left its host reads).
"""

import pytest
import torch

from multirank import run_ranks


def twin_worker(rank, world):
    import torch.distributed as dist

    from zerostream import comm
    from zerostream.comm import host_agreement

    comm.init_distributed(dist_backend="gloo")
    out = {"gloo_world": comm.host_group() is dist.group.WORLD}
    host_agreement._TWINS.clear()
    host_agreement._reduces_on_host = lambda group: False  # as an NCCL-only group reads
    out["unprepared"] = comm.host_group()  # never made lazily: only where all take part
    host_agreement._TWINS.clear()
    twin = comm.prepare_host_group()
    out["twin_is_world"] = twin is dist.group.WORLD
    out["twin_ranks"] = dist.get_process_group_ranks(twin)
    out["twin_backend"] = dist.get_backend(twin)
    out["served"] = comm.host_group() is twin

    used = []
    real = comm.all_reduce

    def recording(tensor, op=comm.ReduceOp.SUM, group=None, async_op=False):
        used.append((group is twin, tensor.device.type))
        return real(tensor, op=op, group=group, async_op=async_op)

    comm.all_reduce = recording
    try:
        out["agreed"] = comm.agree([float(rank), 10.0 - rank], "max")
    finally:
        comm.all_reduce = real
    out["used"] = used
    return out


@pytest.mark.multirank
def test_an_nccl_only_world_agrees_over_a_gloo_twin_made_by_every_rank():
    for out in run_ranks(twin_worker, 2):
        assert out["gloo_world"]  # a Gloo world reduces host tensors itself
        assert out["unprepared"] is None
        assert not out["twin_is_world"] and out["twin_backend"] == "gloo"
        assert out["twin_ranks"] == [0, 1] and out["served"]
        assert out["agreed"] == [1.0, 10.0]
        assert out["used"] == [(True, "cpu")]  # one all-reduce, on the twin, of host memory


def refused_worker(rank, world):
    import torch.distributed as dist

    from zerostream import comm
    from zerostream.comm import host_agreement

    comm.init_distributed(dist_backend="gloo")
    host_agreement._TWINS.clear()
    host_agreement._reduces_on_host = lambda group: False

    def new_group(*args, **kwargs):  # Gloo cannot reach a peer from rank 1 (its network)
        if rank == 1:
            raise RuntimeError("Gloo connectFullMesh failed (stand-in)")
        return dist.group.WORLD  # a stand-in for the twin rank 0 made

    dist.new_group, saved = new_group, dist.new_group
    try:
        twin = comm.prepare_host_group()
    finally:
        dist.new_group = saved
    t = torch.ones(1)
    comm.all_reduce(t)  # the ranks still talk: nothing waits on a half-made twin
    return twin, comm.host_group(), float(t)


@pytest.mark.multirank
def test_a_twin_one_rank_could_not_make_is_used_by_none():
    for twin, served, total in run_ranks(refused_worker, 2):
        assert twin is None and served is None and total == 2.0

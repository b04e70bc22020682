"""Device placement of the ZeRO optimizer path on a GPU, checked without one.

The model lives on a fake "cuda" device (torch's FakeTensorMode: shapes, dtypes and devices
without data), so any op mixing a CPU tensor into a CUDA one fails exactly as on a GPU, and
the collectives are replaced by stand-ins that require what NCCL requires: every tensor on
the GPU. The path is driven as the engine drives it (hook per gradient, after_backward,
step) for a pretend world of 2; autograd itself needs a real CUDA context, so the gradients
are handed to the hooks directly. The one host read of the step (the squared norm) is
counted, and returns a fixed value, since fake tensors hold no data.

This is the test that would have caught the GPU data-path issue's stage-1 crash (the
reduce-scatter output was allocated on the CPU) and the norm all-reduce of an offloaded run
running on a CPU tensor.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from zerostream import comm
from zerostream.config import load
from zerostream.precision import make_loss_scaler
from zerostream.zero.base import ZeroOptimizerBase
from zerostream.zero.factory import build_zero_optimizer, stage_class
from zerostream.zero.protocol import RunState, StageContext, TrainingState

CUDA = torch.device("cuda", 0)


def _nccl_like(name):
    def collective(*tensors, **kwargs):
        for t in tensors:
            if torch.is_tensor(t) and t.device.type != "cuda":
                raise RuntimeError(f"{name}: NCCL needs CUDA tensors; got one on {t.device}")
        return None

    return collective


@pytest.fixture
def gpu_world(monkeypatch):
    """Two pretend ranks whose collectives insist on CUDA tensors; counts host reads."""
    for name in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast"):
        monkeypatch.setattr(comm, name, _nccl_like(name))
    monkeypatch.setattr(comm, "get_global_rank", lambda group, rank: rank)
    reads = []
    monkeypatch.setattr(ZeroOptimizerBase, "_host_scalar", lambda self, t: reads.append(t) or 1.0)
    # The host-memory preflight's verdict, all-reduced at setup (on the GPU: the fake NCCL
    # above checks), is read once; nobody is short here.
    monkeypatch.setattr(comm, "_host_int", lambda t: 0)
    with FakeTensorMode(allow_non_fake_inputs=True):
        yield reads


def _model():
    # Built on the GPU: fake tensors ignore `p.data = ...` device changes, so prepare_module's
    # own .to() cannot be audited here; everything after it is.
    with CUDA:
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


# offload_optimizer has no effect at stage 0, so stage 0 runs without it.
CASES = [
    (stage, offload, precision)
    for stage in (0, 1, 2)
    for offload in ("none", "cpu")
    for precision in ("fp32", "bf16")
    if stage > 0 or offload == "none"
]


@pytest.mark.parametrize("stage,offload,precision", CASES)
def test_the_optimizer_path_keeps_collectives_on_the_gpu(gpu_world, stage, offload, precision):
    zero = {"stage": stage, "reduce_bucket_size": 100, "allgather_bucket_size": 64}
    if offload != "none":
        zero["offload_optimizer"] = {"device": offload}
    cfg = load(
        {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": zero,
            "bf16": {"enabled": precision == "bf16"},
            "zero_force_ds_cpu_optimizer": False,
        },
        world_size=2,
        log=False,
    )
    ctx = StageContext(
        config=cfg,
        group=None,
        rank=1,
        world=2,
        device=CUDA,
        loss_scaler=make_loss_scaler(cfg.fp16),
        run=RunState(),
    )
    model = _model()
    stage_class(stage).prepare_module(model, ctx)
    assert all(p.device == CUDA for p in model.parameters())
    # A client torch optimizer: the fused CPU kernels need real memory, fake tensors have none.
    opt = build_zero_optimizer(
        ctx,
        [{"params": list(model.parameters())}],
        client=lambda groups: torch.optim.AdamW(groups, foreach=False),
    )
    for _ in range(2):
        ctx.run.state = TrainingState.BACKWARD
        for p in reversed(list(model.parameters())):
            p.grad = torch.ones_like(p)
            if stage > 0:
                opt._on_grad(p)  # the post-accumulate-grad hook the stage registered
        opt.after_backward()
        ctx.run.state = TrainingState.STEP
        assert opt.step()
        ctx.run.state = TrainingState.IDLE
    assert len(gpu_world) == 2, "one host read per step (the global squared norm)"
    assert all(p.device == CUDA for p in model.parameters())

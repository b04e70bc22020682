"""16-bit gradient partitions on the host (Note [Gradients to an offloaded partition] in
zero/grad_reduce.py): with bf16, gradient_accumulation_steps 1 and the optimizer offloaded,
reduced gradients are downloaded straight into 16-bit host partitions instead of being added
into fp32 ones. The values are the same reduced 16-bit sums either way, so training must be
bit-identical to the fp32 partitions (`zerostream.offload_gradient_dtype: "fp32"`), on 2
Gloo ranks for stages 1, 2 and 3, with a parameter that gets no gradient every other step
and a last step with no backward at all (what no download wrote must read as zero, not as
the last step's gradient)."""

import pytest
import torch

from multirank import run_ranks

STEPS = 4


class Branchy(torch.nn.Module):
    """Head `c` is used on odd steps only: on even ones its params get no gradient."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 32)
        self.b = torch.nn.Linear(32, 4)
        self.c = torch.nn.Linear(32, 4)

    def forward(self, x, use_c: bool):
        h = torch.relu(self.a(x))
        return (self.c(h) if use_c else self.b(h)).float().pow(2).mean()


def _config(stage: int, grads: str) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.5,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": 300,  # several buckets, pieces split over the ranks
            "offload_optimizer": {"device": "cpu"},
        },
        "zerostream": {"offload_gradient_dtype": grads},
    }


def _engine(stage: int, grads: str):
    import zerostream

    torch.manual_seed(0)
    engine, opt, _, _ = zerostream.initialize(model=Branchy(), config=_config(stage, grads))
    return engine, opt


def train_worker(rank, world, stage):
    from zerostream.zero.grad_reduce import Landing

    through_slots = []
    original = Landing._landed

    def counted(self, *args):
        through_slots.append(1)
        return original(self, *args)

    Landing._landed = counted
    out = {}
    for grads in ("auto", "fp32"):
        through_slots.clear()
        engine, opt = _engine(stage, grads)
        gen = torch.Generator().manual_seed(rank)
        losses, norms = [], []
        for s in range(STEPS):
            loss = engine(torch.randn(2, 8, generator=gen).bfloat16(), s % 2 == 1)
            engine.backward(loss)
            engine.step()
            losses.append(float(loss))
            norms.append(float(engine.get_global_grad_norm()))
        # A step with no backward: no gradient, not the last step's (weight decay and the
        # moments still move the weights).
        engine.step()
        norms.append(float(engine.get_global_grad_norm()))
        out[grads] = {
            "dtype": str(opt.grads[0].dtype),
            "losses": losses,
            "norms": norms,
            "params": [p.detach().float().clone() for p in _full_params(engine, stage)],
            "masters": [m.detach().clone() for m in opt.masters],
            "through_slots": len(through_slots),
            "d2h": opt.copy_stage.stats["d2h_bytes"],
        }
    return out


def _full_params(engine, stage):
    if stage < 3:
        return list(engine.module.parameters())
    import zerostream

    params = list(engine.module.parameters())
    with zerostream.zero.GatheredParameters(params):
        return [p.detach().clone() for p in params]


@pytest.mark.multirank
# Stage 1 lands its gradients through stage 2's Landing at the boundary: slow tier.
@pytest.mark.parametrize("stage", [pytest.param(1, marks=pytest.mark.slow), 2, 3])
def test_16bit_host_gradients_train_bit_identically_to_fp32_ones(stage):
    for rank, out in enumerate(run_ranks(train_worker, 2, stage, timeout=240)):
        new, old = out["auto"], out["fp32"]
        assert new["dtype"] == "torch.bfloat16" and old["dtype"] == "torch.float32"
        # Mechanism: no gradient went through a staging slot and a host-side add; the
        # same 16-bit bytes crossed the link.
        assert new["through_slots"] == 0 and old["through_slots"] > 0
        assert new["d2h"] == old["d2h"] > 0
        assert new["losses"] == old["losses"], f"rank {rank}"
        assert new["norms"] == old["norms"], f"rank {rank}"
        for a, b in zip(new["masters"] + new["params"], old["masters"] + old["params"]):
            assert torch.equal(a, b), f"rank {rank}"


def two_backwards_worker(rank, world):
    """Two backwards before a step with accumulation steps 1 (DeepSpeed adds them): the
    second is added into the 16-bit partition, as the fp32 one adds (to bf16 rounding)."""
    got = {}
    for grads in ("auto", "fp32"):
        engine, opt = _engine(2, grads)
        x = torch.randn(2, 8, generator=torch.Generator().manual_seed(rank)).bfloat16()
        engine.backward(engine(x, False))
        once = opt.grads[0].float().clone()
        engine.backward(engine(x, False))
        got[grads] = (once, opt.grads[0].float().clone())
        engine.step()
    return got


@pytest.mark.multirank
def test_a_second_backward_before_the_step_is_added_not_overwritten():
    for out in run_ranks(two_backwards_worker, 2, timeout=240):
        once, twice = out["auto"]
        assert torch.equal(once, out["fp32"][0])
        assert once.abs().sum() > 0
        torch.testing.assert_close(twice, 2 * once, rtol=1e-2, atol=1e-6)
        torch.testing.assert_close(twice, out["fp32"][1], rtol=1e-2, atol=1e-6)

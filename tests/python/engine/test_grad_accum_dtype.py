"""`data_types.grad_accum_dtype` (ctx.grad_accum_dtype in zero/protocol.py): where
micro-steps' gradients add up. The gradients here are chosen so that bf16 loses the small
ones: four backwards before one step give w the gradients 0.25 once and 2**-11 three
times; 0.25 + 2**-11 rounds back to 0.25 in bf16, so an accumulation in
bf16 ends at 0.25 and one in fp32 at 0.25 + 3 * 2**-11, which safe_get_full_grad reports
before the step. Stage 1's local buffer, a stage-2 offloaded partition (16-bit direct
landing only when the accumulation dtype is the model's) and a coalesced block at stages 2
and 3 each follow it; stage 0 refuses a dtype other than the model's, as DeepSpeed does."""

import contextlib

import pytest
import torch

SMALL = 2.0**-11
XS = [0.25, SMALL, SMALL, SMALL]  # the gradients of w, one a backward


class Dot(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return (self.w * x).sum()


def _config(stage, accum=None, gas=1, **zero):
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "SGD", "params": {"lr": 1.0}},
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage, **zero},
    }
    if accum is not None:
        cfg["data_types"] = {"grad_accum_dtype": accum}
    return cfg


def _accumulated(engine, coalesce=False):
    """The gradient of w after the four micro-steps, before the step (safe_get_full_grad)."""
    from zerostream.utils import safe_get_full_grad

    w = engine.module.w
    ctx = engine.coalesce_grad_reduction() if coalesce else contextlib.nullcontext()
    with ctx:
        for i, x in enumerate(XS):
            engine.set_gradient_accumulation_boundary(i == len(XS) - 1)
            engine.backward(engine(torch.tensor([x], dtype=torch.bfloat16)), scale_wrt_gas=False)
        inside = safe_get_full_grad(w) if coalesce else None
    return float(safe_get_full_grad(w)), None if inside is None else inside.clone()


@pytest.mark.parametrize("accum,expected", [(None, 0.25), ("fp32", 0.25 + 3 * SMALL)])
def test_stage1_accumulates_in_the_asked_dtype(one_rank_process_group, accum, expected):
    import zerostream

    engine, *_ = zerostream.initialize(model=Dot(), config=_config(1, accum, gas=1))
    got, _ = _accumulated(engine)
    assert got == expected
    want = torch.float32 if accum else torch.bfloat16
    assert engine.optimizer.reducer.local[0].dtype == want
    engine.step()
    engine.destroy()


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("accum,expected", [(None, 0.25), ("fp32", 0.25 + 3 * SMALL)])
def test_a_coalesced_block_holds_its_sum_in_the_asked_dtype(
    one_rank_process_group, stage, accum, expected
):
    import zerostream

    engine, *_ = zerostream.initialize(model=Dot(), config=_config(stage, accum, gas=1))
    got, inside = _accumulated(engine, coalesce=True)
    assert inside.dtype == (torch.float32 if accum else torch.bfloat16)
    assert float(inside) == expected  # this rank's own sum, before the reduction
    assert got == expected  # and what the step will use
    engine.step()
    engine.destroy()


@pytest.mark.parametrize("accum,grad_dtype", [(None, torch.bfloat16), ("fp32", torch.float32)])
def test_offloaded_partitions_take_16bit_gradients_only_at_the_models_accumulation(
    one_rank_process_group, accum, grad_dtype
):
    import zerostream

    cfg = _config(2, accum, gas=1, offload_optimizer={"device": "cpu"})
    cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3}}  # the CPU kernel
    engine, *_ = zerostream.initialize(model=Dot(), config=cfg)
    assert engine.optimizer.grads[0].dtype == grad_dtype
    got, _ = _accumulated(engine)
    # Four backwards before one step (gradient_accumulation_steps 1): the direct 16-bit
    # landing adds them in bf16, the fp32 partition exactly.
    assert got == (0.25 if accum is None else 0.25 + 3 * SMALL)
    engine.step()
    engine.destroy()


def test_stage0_refuses_another_accumulation_dtype(one_rank_process_group):
    import zerostream

    # NotImplementedError, DeepSpeed's type (its test_ds_initialize expects it); the config
    # check warns.
    with pytest.raises(NotImplementedError, match="data_types.grad_accum_dtype=fp32"):
        zerostream.initialize(model=Dot(), config=_config(0, "fp32"))
    from zerostream import config

    warned = config.load(_config(0, "fp32"), world_size=1, log=False).warnings
    assert any("initialize() raises NotImplementedError" in w for w in warned), warned

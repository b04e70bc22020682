"""`data_types` (DeepSpeed 0.19): `buffer_dtype` casts the module's floating buffers, which
otherwise keep their dtype beside 16-bit weights (an fp32 rotary `inv_freq`);
`param_dtype` must name the enabled precision. At stages 0 and 3 (the two ways a module is
prepared)."""

import pytest
import torch


def _module():
    m = torch.nn.Sequential(torch.nn.Linear(8, 8))
    m.register_buffer("inv_freq", torch.linspace(0.1, 1.0, 8))
    m.register_buffer("steps", torch.zeros(2, dtype=torch.int64))
    return m


def _config(stage, **data_types):
    return {
        "train_batch_size": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "bf16": {"enabled": True},
        "data_types": data_types,
        "zero_optimization": {"stage": stage},
    }


@pytest.mark.parametrize("stage", [0, 3])
def test_buffer_dtype_casts_floating_buffers_only_when_set(one_rank_process_group, stage):
    import zerostream

    kept, *_ = zerostream.initialize(model=_module(), config=_config(stage))
    assert kept.module.inv_freq.dtype == torch.float32  # the default keeps it
    assert kept._config.param_dtype is None and kept._config.buffer_dtype is None
    kept.destroy()

    engine, *_ = zerostream.initialize(model=_module(), config=_config(stage, buffer_dtype="bf16"))
    assert engine.module.inv_freq.dtype == torch.bfloat16
    assert torch.equal(engine.module.inv_freq, torch.linspace(0.1, 1.0, 8).bfloat16())
    assert engine.module.steps.dtype == torch.int64  # integer buffers are never cast
    assert engine._config.buffer_dtype == "bf16"
    loss = engine(torch.ones(1, 8, dtype=torch.bfloat16)).float().pow(2).sum()
    engine.backward(loss)
    engine.step()
    engine.destroy()


def test_param_dtype_must_name_the_enabled_precision(one_rank_process_group):
    import zerostream

    with pytest.raises(ValueError, match=r'data_types.param_dtype: "fp16" does not match'):
        zerostream.initialize(model=_module(), config=_config(0, param_dtype="fp16"))
    engine, *_ = zerostream.initialize(model=_module(), config=_config(0, param_dtype="bfloat16"))
    assert engine._config.param_dtype == "bfloat16"
    engine.destroy()


def test_initialize_without_a_model_says_how_to_pass_it():
    """DeepSpeed asserts a model; `initialize(model, config=...)` gives it as `args`."""
    import zerostream

    for call in (
        lambda: zerostream.initialize(model=None, config=_config(0)),
        lambda: zerostream.initialize(_module(), config=_config(0)),
    ):
        with pytest.raises(AssertionError, match="requires a model") as info:
            call()
        assert isinstance(info.value, ValueError)
    assert "pass model=" in str(info.value)

"""The `torch_autocast` section (Note [torch_autocast] in zerostream/autocast.py) on one rank:
an fp32 model trained with the engine's forward under torch.autocast equals plain PyTorch
doing the same, at every ZeRO stage; the safe modules' params carry DeepSpeed's comm_dtype
tag; an autocast the caller opens around an engine without the section is switched off
inside it, as DeepSpeed does; bad values are refused by key."""

import logging

import pytest
import torch
import torch.nn as nn

import zerostream

pytestmark = pytest.mark.usefixtures("one_rank_process_group")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.b = nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.relu(self.norm(self.a(x))))


def _data():
    g = torch.Generator().manual_seed(3)
    return [
        (torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(3)
    ]


def _config(stage, **autocast):
    cfg = {
        "train_batch_size": 8,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
    }
    if autocast:
        cfg["torch_autocast"] = autocast
    return cfg


def _weights(engine, stage):
    out = {}
    for name, p in engine.module.named_parameters():
        with zerostream.zero.GatheredParameters(p, enabled=stage == 3):
            out[name] = p.detach().clone()
    return out


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_autocast_training_equals_plain_torch_under_autocast(stage):
    torch.manual_seed(0)
    ref = Net()
    model = Net()
    model.load_state_dict(ref.state_dict())
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.0)
    ref_losses = []
    for x, y in _data():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = ref(x)
        loss = nn.functional.cross_entropy(logits.float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_losses.append(loss.item())

    engine, *_ = zerostream.initialize(
        model=model, config=_config(stage, enabled=True, dtype="bfloat16")
    )
    losses, dtypes = [], set()
    for x, y in _data():
        logits = engine(x)
        dtypes.add(logits.dtype)
        loss = nn.functional.cross_entropy(logits.float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    assert dtypes == {torch.bfloat16}  # the Linear ran in bf16
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    got = _weights(engine, stage)
    for name, p in ref.named_parameters():
        assert got[name].dtype == torch.float32  # the model stays fp32
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-5, atol=1e-6, msg=name)
    # DeepSpeed's tag: the Linear params, not the LayerNorm's.
    tags = {n: getattr(p, "comm_dtype", None) for n, p in model.named_parameters()}
    assert tags == {
        "a.weight": torch.bfloat16,
        "a.bias": torch.bfloat16,
        "norm.weight": None,
        "norm.bias": None,
        "b.weight": torch.bfloat16,
        "b.bias": torch.bfloat16,
    }
    assert engine.torch_autocast_enabled() and engine.torch_autocast_dtype() == torch.bfloat16
    engine.destroy()


def test_safe_modules_from_the_config_and_the_devices_default_dtype():
    engine, *_ = zerostream.initialize(
        model=Net(),
        config=_config(1, enabled=True, lower_precision_safe_modules=["torch.nn.LayerNorm"]),
    )
    tags = {n: getattr(p, "comm_dtype", None) for n, p in engine.module.named_parameters()}
    # No dtype: torch's default for the device (bf16 on a CPU).
    assert tags["norm.weight"] == torch.get_autocast_dtype("cpu") and tags["a.weight"] is None
    assert engine.torch_autocast_lower_precision_safe_modules() == [
        "torch.nn.modules.normalization.LayerNorm"
    ]
    engine.destroy()


def test_an_outer_autocast_is_switched_off_inside_an_engine_without_the_section(caplog):
    engine, *_ = zerostream.initialize(model=Net(), config=_config(1))
    x, _ = _data()[0]
    with caplog.at_level(logging.WARNING, logger="zerostream"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = engine(x)
            plain = engine.module(x)  # the same module outside the engine
    assert out.dtype == torch.float32 and plain.dtype == torch.bfloat16
    assert "has no torch_autocast section" in caplog.text
    assert not engine.torch_autocast_enabled()
    engine.destroy()


@pytest.mark.parametrize(
    "stage,section,error,match",
    [
        (1, {"enabled": True, "dtype": "fp8"}, ValueError, r"torch_autocast\.dtype: 'fp8'"),
        (0, {"enabled": True, "dtype": "fp16"}, NotImplementedError, r"GradScaler"),
        (
            1,
            {"enabled": True, "lower_precision_safe_modules": ["torch.nn.NoSuch"]},
            ValueError,
            r"lower_precision_safe_modules: 'torch\.nn\.NoSuch'",
        ),
    ],
)
def test_bad_values_are_refused_by_key(stage, section, error, match):
    with pytest.raises(error, match=match):
        zerostream.initialize(model=Net(), config=_config(stage, **section))


def test_the_config_no_longer_says_the_section_has_no_effect():
    cfg = zerostream.config.load(_config(1, enabled=True), world_size=1)
    assert not [w for w in cfg.warnings if "torch_autocast" in w]

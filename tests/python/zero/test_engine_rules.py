"""DeepSpeed's optimizer rules and config errors at initialize, one behaviour per test and no
processes: a one-process world needs no process group (comm answers rank 0 of 1), so the
engine is built directly from a loaded config."""

import pytest
import torch

import zerostream
from mlp import MLP
from zerostream.config import load
from zerostream.engine import ZeroEngine
from zerostream.optim_factory import ZeRORuntimeException


def _cfg(stage, optimizer=True, **extra):
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage}, **extra}
    if optimizer:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 0.01}}
    return load(cfg, world_size=1, log=False)


def test_a_client_optimizer_with_offload_needs_zero_force_ds_cpu_optimizer_false():
    model = MLP()
    cfg = _cfg(2, zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}})
    with pytest.raises(ZeRORuntimeException, match="zero_force_ds_cpu_optimizer"):
        ZeroEngine(model, cfg, optimizer=torch.optim.AdamW(model.parameters()))


def test_an_untested_client_optimizer_is_refused_unless_allowed():
    model = MLP()
    with pytest.raises(ValueError, match=r"untested ZeRO Optimizer \(SGD\)") as info:
        ZeroEngine(
            model, _cfg(1, optimizer=False), optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
        )
    assert isinstance(info.value, AssertionError)  # DeepSpeed asserts it
    allowed = _cfg(1, optimizer=False, zero_allow_untested_optimizer=True)
    engine = ZeroEngine(model, allowed, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert type(engine.optimizer.optimizer) is torch.optim.SGD


def test_stage_2_without_an_optimizer_names_the_missing_section():
    with pytest.raises(ValueError, match="zero_optimization.stage 2 requires an optimizer"):
        ZeroEngine(MLP(), _cfg(2, optimizer=False))


def test_the_batch_rule_names_every_term_with_the_world_size():
    with pytest.raises(
        ValueError,
        match=r"train_batch_size: 17 != train_micro_batch_size_per_gpu "
        r"2 \* gradient_accumulation_steps 4 \* data-parallel "
        r"world size 2",
    ):
        load(
            {
                "train_batch_size": 17,
                "train_micro_batch_size_per_gpu": 2,
                "optimizer": {"type": "AdamW", "params": {}},
            },
            world_size=2,
        )


def test_initialize_without_a_config_says_what_deepspeed_says():
    with pytest.raises(
        ValueError, match="^DeepSpeed requires --deepspeed_config to specify configuration file$"
    ):
        zerostream.initialize(model=MLP())


def test_deepspeed_optimizers_zerostream_lacks_are_named():
    cfg = load(
        {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Lamb", "params": {"lr": 0.1}}},
        world_size=1,
        log=False,
    )
    with pytest.raises(NotImplementedError, match="Lamb"):
        ZeroEngine(MLP(), cfg)


def test_backward_needs_a_scalar_loss_with_a_grad_fn():
    engine = ZeroEngine(MLP(), _cfg(0))
    with pytest.raises(ValueError, match="scalar loss"):
        engine.backward(torch.ones(2))


def test_the_engine_exposes_the_phase_its_hooks_see():
    engine = ZeroEngine(MLP(), _cfg(2))
    seen = []
    engine.module.register_forward_hook(lambda *_: seen.append(engine.training_state.value))
    engine.module.a.weight.register_hook(lambda g: seen.append(engine.training_state.value) or g)
    engine.backward(engine(torch.randn(2, 8)))
    engine.step()
    assert seen == ["forward", "backward"] and engine.training_state.value == "idle"


def test_a_missing_engine_attribute_names_the_engine_not_the_module():
    engine = ZeroEngine(MLP(), _cfg(0))
    assert engine.a is engine.module.a  # module attributes are still reachable
    with pytest.raises(
        AttributeError,
        match=r"^'ZeroEngine' object has no attribute "
        r"'no_such_method' \(nor has its module MLP\)$",
    ):
        _ = engine.no_such_method


class _HalfUsed(torch.nn.Module):
    """`spare` never takes part in the loss."""

    def __init__(self):
        super().__init__()
        self.used, self.spare = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x).square().mean()


@pytest.mark.parametrize("stage", [1, 2])
def test_ignore_unused_parameters_false_names_the_params_without_gradients(stage):
    """DeepSpeed's TestStage2IgnoreUnusedParameters: an AssertionError naming the key, raised
    in the loop; with the default (true) the same model trains."""
    x = torch.randn(2, 4)
    strict = _cfg(stage, zero_optimization={"stage": stage, "ignore_unused_parameters": False})
    engine = ZeroEngine(_HalfUsed(), strict)
    with pytest.raises(AssertionError, match="ignore_unused_parameters") as err:
        engine.backward(engine(x))
    assert "2 trainable parameter(s)" in str(err.value)
    assert "param 2 of group 0 (4, 4)" in str(err.value)  # spare.weight
    lenient = ZeroEngine(_HalfUsed(), _cfg(stage))
    before = lenient.module.used.weight.detach().clone()
    lenient.backward(lenient(x))
    lenient.step()
    assert not torch.equal(lenient.module.used.weight, before)

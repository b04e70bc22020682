"""The engine's collaborators and what it asks its stage (engine/records.py, accessors.py,
checkpoints.py): DeepSpeed's counter attributes are the counters record (assignable, and what a
checkpoint saves), the delegating methods keep DeepSpeed's signatures, and the questions that
used to branch on the stage number are the stage class's attributes."""

import inspect
import logging

import pytest
import torch


def _engine(stage: int, **zero):
    import zerostream

    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage, **zero},
    }
    engine, *_ = zerostream.initialize(model=torch.nn.Linear(4, 4), config=config)
    return engine


def test_the_counters_are_one_record_that_scripts_and_checkpoints_share():
    engine = _engine(1)
    for _ in range(2):
        engine.backward(engine(torch.ones(2, 4)).sum())
        engine.step()
    assert (engine.global_steps, engine.micro_steps, engine.global_samples) == (2, 2, 4)
    engine.global_steps = 7  # DeepSpeed scripts assign it (a resume without load_checkpoint)
    assert engine._counters.global_steps == 7
    assert engine._checkpoint_target().counters.global_steps == 7
    assert engine.global_rank == 0 and engine.dp_world_size == 1 and engine.mp_world_size == 1


def test_the_delegating_methods_keep_deepspeeds_signatures():
    from zerostream.engine import ZeroEngine

    params = inspect.signature(ZeroEngine.load_checkpoint).parameters
    assert list(params)[1:3] == ["load_dir", "tag"] and "load_module_only" in params
    assert list(inspect.signature(ZeroEngine.train_batch_size).parameters) == ["self"]
    assert ZeroEngine.train_batch_size.__name__ == "train_batch_size"


@pytest.mark.parametrize("stage, caller_may_reduce", [(0, True), (1, False), (3, False)])
def test_only_stage_0_lets_the_caller_reduce(stage, caller_may_reduce):
    engine = _engine(stage)
    assert engine._stage.caller_may_reduce is caller_may_reduce
    if caller_may_reduce:
        engine.enable_backward_allreduce = False
        assert engine.optimizer.backward_allreduce is False
    else:
        with pytest.raises(NotImplementedError, match=f"at stage {stage} zerostream reduces"):
            engine.enable_backward_allreduce = False


@pytest.mark.parametrize("stage, warned", [(0, False), (1, True), (2, True), (3, False)])
def test_round_robin_gradients_is_named_as_ignored_at_stages_1_and_2(caplog, stage, warned):
    with caplog.at_level(logging.WARNING, logger="zerostream"):
        _engine(stage, round_robin_gradients=True)
    assert ("round_robin_gradients: zerostream" in caplog.text) is warned

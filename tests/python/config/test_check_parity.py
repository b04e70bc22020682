"""`zerostream config check` and initialize() give the same verdict (reliability item 9): the
check builds the config's optimizer and LR scheduler the way initialize does, so a config it
passes does not fail at initialize, and the error is the same text."""

import pytest
import torch

import zerostream
from zerostream import config_check


def _cfg(optimizer=None, scheduler=None):
    cfg = {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    if optimizer is not None:
        cfg["optimizer"] = optimizer
    if scheduler is not None:
        cfg["scheduler"] = scheduler
    return cfg


BAD = [
    (_cfg(scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 0}}),
     "scheduler (WarmupLR): warmup_num_steps"),
    (_cfg(optimizer={"type": "AdamW", "params": {"lr": 1e-3, "betas": [1.5, 0.9]}}),
     "optimizer (AdamW): Invalid beta parameter at index 0: 1.5"),
    (_cfg(optimizer={"type": "SGD", "params": {"lr": 1e-3, "momentum": -1}}),
     "optimizer.params.momentum: must be >= 0; got -1"),
    (_cfg(scheduler={"type": "StepLR", "params": {"step_size": "x"}}),
     "scheduler (StepLR): unsupported operand"),
    (_cfg(scheduler={"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}),
     "scheduler.params.total_num_steps: required by WarmupDecayLR"),
]  # fmt: skip
GOOD = [
    _cfg(),
    _cfg(scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 10}}),
    _cfg(scheduler={"type": "StepLR", "params": {"step_size": 3}}),
    _cfg(optimizer={"type": "Lion", "params": {"lr": 1e-4}}),
]


pytestmark = pytest.mark.usefixtures("one_rank_process_group")


def _initialize_error(cfg):
    try:
        engine, *_ = zerostream.initialize(model=torch.nn.Linear(4, 2), config=cfg)
    except (ValueError, TypeError, NotImplementedError) as exc:
        return str(exc)
    try:  # a scheduler may check its arguments only when it steps, as in training
        engine.backward(engine(torch.randn(2, 4)).sum())
        engine.step()
    except (ValueError, TypeError, NotImplementedError) as exc:
        return str(exc)
    finally:
        engine.destroy()
    return None


@pytest.mark.parametrize("cfg,message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_check_refuses_what_initialize_refuses_with_the_same_words(cfg, message):
    result = config_check.check(cfg, world_size=1)
    assert not result["ok"]
    (error,) = result["errors"]
    assert error.startswith(message), error
    at_init = _initialize_error(cfg)
    # initialize's text holds the check's error (the config reader's) or the reverse (the
    # optimizer's or scheduler's own words, prefixed by the check with the section).
    assert at_init is not None and (at_init in error or error in at_init), (at_init, error)


@pytest.mark.parametrize("cfg", GOOD)
def test_check_passes_what_initialize_accepts(cfg):
    assert config_check.check(cfg, world_size=1)["ok"]
    assert _initialize_error(cfg) is None

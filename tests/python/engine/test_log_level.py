"""`log_level` in the config sets the logger DeepSpeed's code logs through
(`deepspeed.utils.logger` is zerostream's), as DeepSpeed's engine does; omitted, the
logger's own level stays; a name that is no logging level is refused by the config."""

import logging

import pytest
import torch


def _config(**extra):
    return {
        "train_batch_size": 1,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        **extra,
    }


def test_log_level_sets_the_logger(one_rank_process_group):
    import zerostream

    logger = logging.getLogger("zerostream")
    saved = logger.level
    try:
        logger.setLevel(logging.DEBUG)
        engine, *_ = zerostream.initialize(model=torch.nn.Linear(2, 2), config=_config())
        assert engine.log_level() is None and logger.level == logging.DEBUG  # left alone
        engine.destroy()
        engine, *_ = zerostream.initialize(
            model=torch.nn.Linear(2, 2), config=_config(log_level="ERROR")
        )
        assert engine.log_level() == "ERROR" and logger.getEffectiveLevel() == logging.ERROR
        engine.destroy()
        with pytest.raises(ValueError, match="log_level: expected one of debug"):
            zerostream.initialize(model=torch.nn.Linear(2, 2), config=_config(log_level="loud"))
    finally:
        logger.setLevel(saved)

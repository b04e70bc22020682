"""The `elasticity` section (zerostream/elasticity.py): the chosen batch's valid GPU counts
against a brute-force count, DeepSpeed's published example (unit/elasticity/test_elastic.py:
9792 over 23 GPU counts), and at config load the batch keys set for the run's world size,
with DeepSpeed's errors for batch keys beside it and a world size outside the valid list."""

import pytest
import torch

from zerostream import config
from zerostream.config.elasticity import (
    ElasticityConfigError,
    ElasticityIncompatibleWorldSize,
    compute_elastic_config,
)


def _section(**kw):
    base = {"enabled": True, "max_train_batch_size": 100, "micro_batch_sizes": [2, 4],
            "min_gpus": 1, "max_gpus": 8, "version": 0.1}  # fmt: skip
    base.update(kw)
    return {"elasticity": base}


def _brute_force_valid(batch, micro, lo, hi):
    return [g for g in range(lo, hi + 1) if any(batch % (g * m) == 0 for m in micro)]


@pytest.mark.parametrize(
    "max_batch, micro, lo, hi",
    [(10000, [8, 12, 16, 17], 32, 1500), (100, [2, 4], 1, 8), (2000, [2, 4, 6], 1, 10000),
     (513, [3, 5, 7], 2, 64), (64, [64], 1, 4)],
)  # fmt: skip
def test_valid_gpu_counts_are_exactly_those_that_divide_the_batch(max_batch, micro, lo, hi):
    cfg = _section(
        max_train_batch_size=max_batch, micro_batch_sizes=micro, min_gpus=lo, max_gpus=hi
    )
    batch, valid = compute_elastic_config(cfg, "0.19.8")
    assert batch <= max_batch and valid == _brute_force_valid(batch, micro, lo, hi) and valid
    for world in valid[:5]:
        _, _, mb = compute_elastic_config(cfg, "0.19.8", world_size=world)
        # The largest micro-batch size that splits this rank's share.
        assert mb == max(m for m in micro if (batch // world) % m == 0)


def test_deepspeeds_example_and_preference():
    cfg = _section(max_train_batch_size=10000, micro_batch_sizes=[8, 12, 16, 17], min_gpus=32,
                   max_gpus=1500)  # fmt: skip
    batch, valid = compute_elastic_config(cfg, "0.19.8")
    assert (batch, len(valid)) == (9792, 23)  # DeepSpeed's test_basic_10k
    # prefer_larger_batch false: the smallest candidate with as many counts.
    small, small_valid = compute_elastic_config(
        {"elasticity": dict(cfg["elasticity"], prefer_larger_batch=False)}, "0.19.8"
    )
    assert len(small_valid) == len(valid) and small <= batch


def test_load_sets_the_batch_keys_for_the_world():
    cfg = config.load(_section(), world_size=2)
    batch, _, micro = compute_elastic_config(_section(), "0.19.8", world_size=2)
    assert cfg.train_batch_size == batch and cfg.train_micro_batch_size_per_gpu == micro
    assert micro * cfg.gradient_accumulation_steps * 2 == batch
    assert not any("elasticity" in w for w in cfg.warnings)  # implemented: no "no effect"


def test_batch_keys_beside_it_and_bad_worlds_are_refused_by_name():
    given = dict(_section(), train_batch_size=8)
    with pytest.raises(ElasticityConfigError, match="ignore_non_elastic_batch_info"):
        config.load(given, world_size=2)
    given["elasticity"]["ignore_non_elastic_batch_info"] = True
    assert config.load(given, world_size=2).train_batch_size != 8
    with pytest.raises(ElasticityIncompatibleWorldSize, match="world size 9"):
        config.load(_section(), world_size=9)  # max_gpus 8
    with pytest.raises(ElasticityConfigError, match=r"elasticity\.micro_batch_sizes"):
        config.load(_section(micro_batch_sizes=[2, 0.5]), world_size=1)
    with pytest.raises(ElasticityConfigError, match=r"elasticity\.max_train_batch_size"):
        config.load({"elasticity": {"enabled": True, "micro_batch_sizes": [2]}}, world_size=1)
    disabled = config.load({"elasticity": {"enabled": False}, "train_batch_size": 4}, world_size=1)
    assert disabled.train_batch_size == 4


def test_initialize_trains_with_the_elastic_batch(one_rank_process_group):
    import zerostream

    ds = _section(micro_batch_sizes=[2, 3], max_train_batch_size=12)
    ds["optimizer"] = {"type": "SGD", "params": {"lr": 0.1}}
    engine, *_ = zerostream.initialize(model=torch.nn.Linear(4, 1), config=ds)
    batch, _, micro = compute_elastic_config(ds, "0.19.8", world_size=1)
    assert engine.get_batch_info() == (batch, micro, batch // micro)
    engine.destroy()

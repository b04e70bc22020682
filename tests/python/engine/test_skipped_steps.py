"""Skipped steps are never silent (reliability item 2): inf/NaN in the fp32 weights or the
optimizer state is an error naming the state (and, on NVMe, the sub-group and its swap file),
not an "overflow"; a run of skips stops after zerostream.max_consecutive_skipped_steps; a
corrupt swap file is caught by checksums, which are on by default."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

import zerostream
from zerostream.zero.skips import NonFiniteStateError, SkippedStepsError, first_non_finite

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mlp import MLP  # noqa: E402
from multirank import run_ranks  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_rank_process_group")


def _config(stage=0, precision="fp32", **extra):
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": stage},
        **extra,
    }
    if precision != "fp32":
        cfg[precision] = {"enabled": True}
    return cfg


def _engine(cfg, seed=0):
    torch.manual_seed(seed)
    model = MLP()
    engine, opt, _, _ = zerostream.initialize(
        model=model, model_parameters=model.parameters(), config=cfg
    )
    return engine, opt


def _train(engine, steps, x=None, nan_loss=lambda step: False):
    x = torch.randn(2, 8) if x is None else x
    x = x.to(next(engine.module.parameters()).dtype)
    for step in range(steps):
        loss = engine(x)
        if nan_loss(step):
            loss = loss * float("nan")
        engine.backward(loss)
        engine.step()


def test_first_non_finite_finds_the_first_bad_element_across_chunks():
    t = torch.zeros(100)
    assert first_non_finite(t, chunk=7) == -1
    t[53], t[80] = float("inf"), float("nan")
    assert first_non_finite(t, chunk=7) == 53
    assert first_non_finite(t.to(torch.bfloat16), chunk=64) == 53
    assert first_non_finite(torch.arange(5)) == -1  # integer state (step counts) is skipped


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_run_of_skips_stops_with_an_error_that_names_the_key(precision):
    cfg = _config(1, precision, zerostream={"max_consecutive_skipped_steps": 4})
    if precision == "fp16":
        cfg["fp16"].update(initial_scale_power=12, min_loss_scale=1, hysteresis=1)
    engine, _ = _engine(cfg)
    # Skips broken by an applied step do not count together.
    _train(engine, 7, nan_loss=lambda step: step != 3)
    assert engine.skipped_steps == 6
    with pytest.raises(SkippedStepsError, match=r"max_consecutive_skipped_steps: 4") as err:
        _train(engine, 5, nan_loss=lambda step: True)
    assert "last 4 steps" in str(err.value) and precision in str(err.value)
    assert "[rank 0]" in str(err.value)


def test_zero_never_stops_on_skips():
    engine, _ = _engine(_config(0, "bf16", zerostream={"max_consecutive_skipped_steps": 0}))
    _train(engine, 60, nan_loss=lambda step: True)
    assert engine.skipped_steps == 60


def test_the_default_limit_is_fifty():
    engine, _ = _engine(_config(0, "bf16"))
    with pytest.raises(SkippedStepsError, match="last 50 steps"):
        _train(engine, 51, nan_loss=lambda step: True)
    assert engine.skipped_steps == 50


@pytest.mark.parametrize(
    ("stage", "offload"),
    [(0, None), (2, None), (2, "cpu"), (1, "cpu")],
)
def test_nan_in_the_masters_is_an_error_not_an_overflow(stage, offload):
    extra = {}
    if offload:
        extra = {"offload_optimizer": {"device": offload}}
    cfg = _config(stage, "bf16" if stage else "fp32")
    cfg["zero_optimization"].update(extra)
    engine, opt = _engine(cfg)
    _train(engine, 2)
    master = engine.optimizer.optimizer.param_groups[0]["params"][0]
    with torch.no_grad():
        master.view(-1)[5] = float("nan")  # what a corrupt read or a diverged update leaves
    with pytest.raises(NonFiniteStateError, match=r"fp32 weights of param group 0") as err:
        _train(engine, 3)
    assert "(first at 5)" in str(err.value) and "not an overflow" in str(err.value)
    assert engine.skipped_steps == 1  # the first skip stops it, not the 50th


def test_nan_in_the_optimizer_moments_is_named():
    engine, opt = _engine(_config(2, "bf16"))
    _train(engine, 2)
    master = opt.optimizer.param_groups[0]["params"][0]
    opt.optimizer.state[master]["exp_avg_sq"].view(-1)[9] = float("-inf")
    with pytest.raises(NonFiniteStateError, match=r"optimizer state 'exp_avg_sq'"):
        _train(engine, 3)


def _nvme_config(path, checksums=None):
    extra = {} if checksums is None else {"zerostream": {"verify_swap_checksums": checksums}}
    cfg = _config(1, "bf16", **extra)
    cfg["zero_optimization"].update(
        sub_group_size=64,
        offload_optimizer={"device": "nvme", "nvme_path": str(path)},
    )
    return cfg


def _corrupt_param_extent(opt, sub_group):
    """Overwrites sub-group `sub_group`'s fp32 params on disk with 0xFF bytes (NaN)."""
    path, offset, _ = opt.swapper.store.extent_of(3 * sub_group)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\xff" * 64, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def test_a_corrupt_swap_file_without_checksums_names_the_sub_group_and_file(tmp_path):
    engine, opt = _engine(_nvme_config(tmp_path, checksums=False))
    _train(engine, 2)
    assert len(opt.swapper.sub_groups) > 2
    path = _corrupt_param_extent(opt, 2)
    with pytest.raises(NonFiniteStateError, match=r"sub-group 2 \(param group 0") as err:
        _train(engine, 3)
    assert path in str(err.value) and "verify_swap_checksums" in str(err.value)
    engine.destroy()


def test_checksums_are_on_by_default_and_catch_the_same_corruption(tmp_path):
    engine, opt = _engine(_nvme_config(tmp_path))
    assert engine._config.zerostream.verify_swap_checksums is True
    _train(engine, 2)
    path = _corrupt_param_extent(opt, 1)
    with pytest.raises(OSError, match="checksum mismatch") as err:
        _train(engine, 1)
    assert path in str(err.value)
    engine.destroy()


def _two_rank_worker(rank, world):
    engine, opt = _engine(_config(2, "bf16"))
    _train(engine, 2, x=torch.ones(2, 8))
    if rank == 1:
        master = opt.optimizer.param_groups[0]["params"][0]
        with torch.no_grad():
            master.view(-1)[0] = float("nan")
    try:
        _train(engine, 3, x=torch.ones(2, 8))
    except NonFiniteStateError as e:
        return str(e)
    return "no error"


@pytest.mark.multirank
def test_every_rank_stops_when_one_rank_holds_nan_state():
    r0, r1 = run_ranks(_two_rank_worker, 2, timeout=180)
    assert r1.startswith("[rank 1]") and "fp32 weights of param group 0" in r1
    assert r0.startswith("[rank 0]") and "global rank 1" in r0

"""The engine's flops_profiler section (engine/profiling.py): rank 0 profiles the forward of
global step `profile_step` and prints it in the step() that follows, to stdout or
`output_file`; the counts are the model's by hand. And the section's bad values."""

import re

import pytest
import torch

from mlp import MLP
from multirank import run_ranks

# MLP (tests/python/mlp.py): Linear 8->16, relu, Linear 16->4, on micro-batches of 2.
MICRO = 2
MACS = MICRO * (8 * 16 + 16 * 4)
FLOPS = 2 * MACS + MICRO * 16  # the relu: one per element
PARAMS = (8 * 16 + 16) + (16 * 4 + 4)


def _config(stage=0, gas=1, **section):
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": gas,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": stage},
        "flops_profiler": {"enabled": True, **section},
    }


def _train(cfg, steps):
    import zerostream

    torch.manual_seed(0)
    engine, *_ = zerostream.initialize(model=MLP(), config=cfg)
    for _ in range(steps * engine.gradient_accumulation_steps()):
        engine.backward(engine(torch.randn(MICRO, 8)))
        engine.step()
    return engine


def test_the_profile_step_is_printed_once_with_the_models_counts(one_rank_process_group, capsys):
    engine = _train(_config(profile_step=2, top_modules=2), steps=4)
    out = capsys.readouterr().out
    # global_steps is 2 during the third step; the step() that ends it prints step 3.
    assert re.findall(r"Profile Summary at step (\d+)", out) == ["3"]
    assert re.search(r"^fwd MACs per GPU:\s+384 MACs$", out, re.M)
    assert re.search(r"^fwd flops per GPU:\s+800 $", out, re.M)
    assert re.search(r"^batch size per GPU:\s+2$", out, re.M)
    assert "(a): Linear(144 = 67.92% Params" in out  # detailed: the default
    prof = engine.flops_profiler
    assert (prof.flops, prof.macs, prof.params) == (FLOPS, MACS, PARAMS)
    assert not prof.started  # ended after printing; later steps profile nothing
    assert engine.flops_profiler_enabled() and engine.flops_profiler_profile_step() == 2
    engine.destroy()


def test_a_disabled_section_profiles_nothing(one_rank_process_group, capsys):
    cfg = _config()
    cfg["flops_profiler"]["enabled"] = False
    engine = _train(cfg, steps=2)
    assert engine.flops_profiler is None
    assert "Profile Summary" not in capsys.readouterr().out
    engine.destroy()


def two_rank_worker(rank, world, out):
    cfg = _config(
        stage=3, gas=2, profile_step=1, detailed=False, output_file=str(out / f"rank{rank}.txt")
    )
    engine = _train(cfg, steps=3)
    prof = engine.flops_profiler
    result = (prof.flops, prof.macs, prof.params, prof.started)
    engine.destroy()
    return result


@pytest.mark.multirank
def test_two_ranks_stage_3_only_rank_0_writes_the_output_file(tmp_path):
    results = run_ranks(two_rank_worker, 2, tmp_path, timeout=180)
    # Stage 3 keeps a shard of each param between forwards: the profile counts the whole
    # model's (ds_numel), the forward's flops those of one micro-batch.
    assert results[0] == (FLOPS, MACS, PARAMS, False)
    assert results[1] == (0, 0, 0, False)  # rank 1 never profiles
    assert not (tmp_path / "rank1.txt").exists()
    text = (tmp_path / "rank0.txt").read_text()
    assert re.findall(r"Profile Summary at step (\d+)", text) == ["2"]
    assert re.search(r"^world size:\s+2$", text, re.M)
    assert re.search(r"^data parallel size:\s+2$", text, re.M)
    assert re.search(r"^params per GPU:\s+212$", text, re.M)
    assert "Detailed Profile" not in text


@pytest.mark.parametrize(
    "section, message",
    [
        ({"profile_step": -1}, r"flops_profiler.profile_step: must be >= 0; got -1"),
        ({"module_depth": -2}, r"flops_profiler.module_depth: must be >= -1; got -2"),
        ({"top_modules": -1}, r"flops_profiler.top_modules: must be >= 0; got -1"),
        ({"recompute_fwd_factor": -1.0}, r"flops_profiler.recompute_fwd_factor: must be >= 0"),
        ({"output_file": 3}, r"flops_profiler.output_file: expected a string; got 3"),
        ({"detailed": [1]}, r"flops_profiler.detailed: expected"),
    ],
)
def test_bad_values_are_refused_by_key(section, message):
    from zerostream import config

    with pytest.raises(config.ConfigError, match=message):
        config.load(_config(**section))


def test_an_unknown_key_is_warned_and_ignored_as_deepspeed_does():
    """DeepSpeed reads the section with dict lookups: its own test passes "step", which it
    ignores (profile_step stays 1)."""
    from zerostream import config

    cfg = config.load(_config(step=3))
    assert cfg.flops_profiler.profile_step == 1
    assert any(w.startswith("flops_profiler.step: unknown key") for w in cfg.warnings)


def test_with_wall_clock_breakdown_the_summary_has_the_steps_latencies(
    one_rank_process_group, capsys
):
    cfg = _config(profile_step=1, detailed=False, recompute_fwd_factor=1.0)
    cfg["wall_clock_breakdown"] = True
    engine = _train(cfg, steps=2)
    out = capsys.readouterr().out
    for label in ("bwd latency:", "step latency:", "iter latency:", "samples/second:"):
        assert re.search(rf"^{label}\s+\S", out, re.M), label
    # bwd flops = (2 + recompute_fwd_factor) * fwd flops, as DeepSpeed's summary labels them.
    assert "bwd FLOPS per GPU = 3 * fwd flops per GPU / bwd latency:" in out
    engine.destroy()

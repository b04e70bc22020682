"""The engine's monitor events (monitor/engine_events.py) read back with TensorBoard's own
reader and the csv module, compared with what the training loop saw: the loss of every
step, the lr after it and, with fp16, the loss scale, at DeepSpeed's sample counts; only
rank 0 writes."""

import sys

import numpy as np
import pytest
import torch
from tb_reader import csv_rows, require_tensorboard, tensorboard_scalars

from mlp import MLP
from multirank import run_ranks

LOSS, LR, SCALE = "Train/Samples/train_loss", "Train/Samples/lr", "Train/Samples/loss_scale"
WARMUP = {
    "type": "WarmupLR",
    "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01, "warmup_num_steps": 10},
}


def _config(out, writers=("tensorboard", "csv_monitor"), **extra):
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "scheduler": WARMUP,
        "zero_optimization": {"stage": 2},
    }
    for w in writers:
        cfg[w] = {"enabled": True, "output_path": str(out), "job_name": "job"}
    cfg.update(extra)
    return cfg


def _train(cfg, steps, half=False, poison=()):
    """Trains `steps` optimizer steps; returns what the loop saw per step: (samples before,
    the step's loss as the engine scales it, samples after, lr after, loss scale after)."""
    import zerostream

    torch.manual_seed(0)
    engine, *_ = zerostream.initialize(model=MLP(), config=cfg)
    gas = engine.gradient_accumulation_steps()
    seen = []
    for step in range(steps):
        before, total = engine.global_samples, None
        for _ in range(gas):
            x = torch.randn(2, 8)
            loss = engine(x.half() if half else x)
            if step in poison:
                loss = loss * float("inf")
            engine.backward(loss)
            part = loss.detach().float() / gas  # DeepSpeed's: the fp32 loss over the accumulation
            total = part if total is None else total + part
            engine.step()
        scale = engine.loss_scale() if half else None
        seen.append((before, total.item(), engine.global_samples, engine.get_lr()[0], scale))
    return engine, seen


def _f32(x: float) -> float:
    """The value as TensorBoard stores a scalar (a float32)."""
    return float(np.float32(x))


def test_csv_files_hold_each_steps_loss_and_lr(tmp_path, one_rank_process_group):
    engine, seen = _train(_config(tmp_path, writers=("csv_monitor",)), steps=3)
    job = tmp_path / "job"
    assert sorted(p.name for p in job.iterdir()) == [
        "Train_Samples_lr.csv",
        "Train_Samples_train_loss.csv",
    ]  # fp32: no loss scale
    loss_rows = csv_rows(job / "Train_Samples_train_loss.csv")
    lr_rows = csv_rows(job / "Train_Samples_lr.csv")
    assert loss_rows[0] == ["step", "train_loss"] and lr_rows[0] == ["step", "lr"]
    # Loss at the samples seen before its step (0, 4, 8), lr at those after (4, 8, 12).
    assert [(int(s), float(v)) for s, v in loss_rows[1:]] == [(b, loss) for b, loss, *_ in seen]
    assert [(int(s), float(v)) for s, v in lr_rows[1:]] == [(a, lr) for _, _, a, lr, _ in seen]
    assert [b for b, *_ in seen] == [0, 4, 8]
    assert len({lr for *_, lr, _ in seen}) == 3  # the warmup moved it every step
    engine.destroy()


def test_tensorboard_events_hold_each_steps_loss_and_lr(tmp_path, one_rank_process_group):
    require_tensorboard()
    engine, seen = _train(_config(tmp_path, writers=("tensorboard",)), steps=3)
    scalars = tensorboard_scalars(tmp_path / "job")
    assert set(scalars) == {LOSS, LR}
    assert scalars[LOSS] == [(b, _f32(loss)) for b, loss, *_ in seen]
    assert scalars[LR] == [(a, _f32(lr)) for _, _, a, lr, _ in seen]
    engine.destroy()


def test_nothing_is_written_while_the_sections_are_disabled(tmp_path, one_rank_process_group):
    cfg = _config(tmp_path)
    for w in ("tensorboard", "csv_monitor"):
        cfg[w]["enabled"] = False
    engine, _ = _train(cfg, steps=1)
    assert engine.monitor.master is None and not (tmp_path / "job").exists()
    engine.destroy()


@pytest.mark.parametrize(
    "section, module, package",
    [
        ("tensorboard", "tensorboard", "tensorboard"),
        ("wandb", "wandb", "wandb"),
        ("comet", "comet_ml", "comet_ml"),
    ],
)
def test_an_enabled_writer_without_its_package_names_both(
    section, module, package, tmp_path, one_rank_process_group, monkeypatch
):
    import zerostream

    monkeypatch.setitem(sys.modules, module, None)  # what `import module` sees uninstalled
    cfg = _config(tmp_path, writers=())
    cfg[section] = {"enabled": True}
    with pytest.raises(ImportError, match=rf"{section}\.enabled: true needs the `{package}`"):
        zerostream.initialize(model=MLP(), config=cfg)


def fp16_two_rank_worker(rank, world, out):
    # Rank 1 is given its own folder: whatever it wrote would show there.
    cfg = _config(
        out / f"rank{rank}",
        fp16={"enabled": True, "initial_scale_power": 8, "hysteresis": 1},
    )
    engine, seen = _train(cfg, steps=4, half=True, poison=(1,))
    writer = engine.monitor.master.tb_monitor.summary_writer
    return seen, writer is not None, engine.skipped_steps


@pytest.mark.multirank
def test_two_ranks_fp16_only_rank_0_writes_its_loss_lr_and_loss_scale(tmp_path):
    require_tensorboard()
    results = run_ranks(fp16_two_rank_worker, 2, tmp_path, timeout=180)
    (seen, has_writer0, skipped), (_, has_writer1, _) = results
    assert (has_writer0, has_writer1) == (True, False)
    assert not (tmp_path / "rank1").exists()
    assert skipped == 1  # the poisoned step overflowed: its events are written all the same
    assert [s for *_, s in seen] == [256.0, 128.0, 128.0, 128.0]
    job = tmp_path / "rank0" / "job"
    scalars = tensorboard_scalars(job)
    assert scalars[LOSS] == [(b, _f32(loss)) for b, loss, *_ in seen]
    assert scalars[LR] == [(a, _f32(lr)) for _, _, a, lr, _ in seen]
    assert scalars[SCALE] == [(a, s) for _, _, a, _, s in seen]
    assert scalars[LOSS][1][1] == float("inf")
    rows = csv_rows(job / "Train_Samples_loss_scale.csv")
    assert rows == [["step", "loss_scale"]] + [[str(a), str(s)] for _, _, a, _, s in seen]

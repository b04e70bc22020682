"""wall_clock_breakdown (engine/profiling.py, profiling/timers.py): the phases' timers, their
printed lines and the monitors' `Train/Samples/elapsed_time_ms_*` events, read back with
TensorBoard's own reader and the csv module; none of it when the key is off."""

import time

import torch
from tb_reader import csv_rows, require_tensorboard, tensorboard_scalars

from mlp import MLP

PHASES = ("forward", "backward", "backward_inner", "backward_allreduce", "step")
EVENT = "Train/Samples/elapsed_time_ms_{}"
SLEEP_S = 0.02


class SlowMLP(MLP):
    """The forward sleeps SLEEP_S: a floor the forward timer must show."""

    def forward(self, x):
        time.sleep(SLEEP_S)
        return super().forward(x)


def _train(out, wall_clock: bool, steps=3, gas=2):
    import zerostream

    torch.manual_seed(0)
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": gas,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": 2},
        "wall_clock_breakdown": wall_clock,
        "tensorboard": {"enabled": True, "output_path": str(out), "job_name": "job"},
        "csv_monitor": {"enabled": True, "output_path": str(out), "job_name": "job"},
    }
    engine, *_ = zerostream.initialize(model=SlowMLP(), config=cfg)
    for _ in range(steps * gas):
        engine.backward(engine(torch.randn(2, 8)))
        engine.step()
    engine.monitor.close()
    return engine


def test_on_every_phase_is_timed_and_written(tmp_path, one_rank_process_group, capsys):
    require_tensorboard()
    engine = _train(tmp_path, wall_clock=True)
    job = tmp_path / "job"
    by_phase = {}
    for phase in PHASES:
        rows = csv_rows(job / f"Train_Samples_elapsed_time_ms_{phase}.csv")
        assert rows[0] == ["step", f"elapsed_time_ms_{phase}"]
        by_phase[phase] = [(int(s), float(v)) for s, v in rows[1:]]
        # One event per optimizer step, at the samples seen after it (4 a step).
        assert [s for s, _ in by_phase[phase]] == [4, 8, 12]
        assert all(v > 0 for _, v in by_phase[phase])
    for i in range(3):
        ms = {phase: by_phase[phase][i][1] for phase in PHASES}
        assert ms["forward"] >= 2 * 1000 * SLEEP_S  # two micro-steps' forwards
        # backward encloses its autograd and its gradient hand-off, one after the other.
        assert ms["backward"] >= ms["backward_inner"] + ms["backward_allreduce"]
    scalars = tensorboard_scalars(job)
    for phase in PHASES:
        assert [s for s, _ in scalars[EVENT.format(phase)]] == [4, 8, 12]
        assert all(v > 0 for _, v in scalars[EVENT.format(phase)])
    out = capsys.readouterr().out
    # Each step() prints its micro-step timers, each boundary the step's (DeepSpeed's).
    assert out.count("[Rank 0] time (ms) | fwd_microstep: ") == 6
    assert out.count("[Rank 0] time (ms) | fwd: ") == 3
    assert engine.wall_clock_breakdown()
    timers = engine.get_wall_clock_timers()
    assert sorted(timers) == sorted(
        ["fwd_microstep", "bwd_microstep", "bwd_inner_microstep", "bwd_allreduce_microstep",
         "step_microstep", "fwd", "bwd", "bwd_inner", "bwd_allreduce", "step"]
    )  # fmt: skip
    assert timers["fwd"] == by_phase["forward"][-1][1]
    engine.destroy()


def test_off_nothing_is_timed_or_written(tmp_path, one_rank_process_group, capsys):
    engine = _train(tmp_path, wall_clock=False, steps=1)
    job = tmp_path / "job"
    assert sorted(p.name for p in job.iterdir() if p.suffix == ".csv") == [
        "Train_Samples_lr.csv",
        "Train_Samples_train_loss.csv",
    ]
    assert not any(tag.startswith("Train/Samples/elapsed") for tag in tensorboard_scalars(job))
    assert engine.timers.get_timers() == {}  # no timer was ever started
    assert engine.get_wall_clock_timers() == {}
    assert "time (ms)" not in capsys.readouterr().out
    engine.destroy()

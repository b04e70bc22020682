"""The throughput timer (DeepSpeed's engine.tput_timer, profiling/throughput.py): warm-up
steps counted but not timed, micro-steps summed into their global step, the samples per
second it logs against the time the loop took, and the `timers` section."""

import logging

import torch

from zerostream.profiling.throughput import ThroughputTimer


class Config:
    enabled, synchronized = True, False


class Clock:
    """time.time for the timer: advanced by the test, so the sums are exact."""

    def __init__(self):
        self.now = 1000.0

    def time(self):
        return self.now


def test_warm_up_then_timed_global_steps(monkeypatch):
    from zerostream.profiling import throughput

    clock = Clock()
    monkeypatch.setattr(throughput, "time", clock)
    lines = []
    t = ThroughputTimer(Config(), batch_size=12, start_step=2, steps_per_output=2,
                        logging_fn=lines.append)  # fmt: skip
    t.stop()  # before any start: nothing
    assert (t.initialized, t.micro_step_count) == (False, 0)
    for step in range(6):  # 6 global steps of 3 micro-steps each, 0.25 s each, 1 s between
        for micro in range(3):
            t.start()
            clock.now += 0.25
            t.stop(global_step=micro == 2)
            clock.now += 1.0  # outside forward-to-step: not timed
        if step < 2:  # warm-up: not timed
            assert t.start_time == 0 and t.total_elapsed_time == 0
    assert (t.micro_step_count, t.global_step_count) == (18, 6)
    assert t.step_elapsed_time == 0  # reset at each global step
    assert t.total_elapsed_time == 4 * 3 * 0.25  # global steps 3-6
    assert t.avg_samples_per_sec() == 12 / 0.75
    # steps 4 and 6 are report boundaries (steps_per_output 2), in DeepSpeed's wording
    assert len(lines) == 2 and lines[0].startswith("epoch=0/micro_step=12/global_step=4, ")
    assert "RunningAvgSamplesPerSec=16.0, CurrSamplesPerSec=15.99" in lines[1]
    assert "MaxMemAllocated=" in lines[1]


def test_disabled_timer_counts_nothing():
    class Off:
        enabled, synchronized = False, False

    t = ThroughputTimer(Off(), batch_size=4)
    t.start()
    t.stop(global_step=True)
    assert (t.started, t.micro_step_count, t.global_step_count) == (False, 0, 0)
    assert t.avg_samples_per_sec() == float("-inf")


def test_engine_times_forward_to_step_and_logs_at_steps_per_print(caplog):
    import zerostream

    model = torch.nn.Linear(4, 1)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "steps_per_print": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    }
    engine, *_ = zerostream.initialize(model=model, config=config)
    timer = engine.tput_timer
    assert timer.batch_size == 4 and not timer.synchronized  # zerostream's default
    with caplog.at_level(logging.INFO, logger="zerostream"):
        for _ in range(8):
            loss = engine(torch.ones(2, 4)).sum()
            engine.backward(loss)
            engine.step()
    assert (timer.micro_step_count, timer.global_step_count) == (8, 4)
    assert timer.total_elapsed_time > 0
    said = [r.getMessage() for r in caplog.records if "SamplesPerSec" in r.getMessage()]
    assert [s.split(",")[0] for s in said] == [
        "epoch=0/micro_step=8/global_step=4",
    ]  # step 2 is still warm-up (start_step 2): its time is 0, nothing logged
    engine.destroy()
    quiet = {**config, "timers": {"throughput": {"enabled": False}}}
    off = zerostream.initialize(model=torch.nn.Linear(4, 1), config=quiet)[0]
    assert not off.tput_timer.enabled
    off.destroy()

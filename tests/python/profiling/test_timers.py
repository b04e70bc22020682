"""DeepSpeed's wall-clock timers (profiling/timers.py) on the host clock, against sleeps."""

import time

import pytest

from zerostream.profiling import NoopTimer, SynchronizedWallClockTimer

SLEEP_S = 0.02


def test_timer_spans_add_up_until_reset(capsys):
    timers = SynchronizedWallClockTimer()
    t = timers("phase")
    for _ in range(2):
        t.start()
        time.sleep(SLEEP_S)
        t.stop()
    assert t.elapsed(reset=False) >= 2 * 1000 * SLEEP_S
    assert len(t.elapsed_records) == 2
    t.start()
    time.sleep(SLEEP_S)
    running = t.elapsed(reset=True)  # a running span counts up to now and goes on running
    assert running >= 3 * 1000 * SLEEP_S and t.started_
    t.stop()
    assert t.elapsed() < 1000 * SLEEP_S  # only the span since the reset
    assert t.elapsed() == 0  # reset by the read before
    with pytest.raises(RuntimeError, match="'phase': stop\\(\\) while it is not running"):
        t.stop()
    t.start()
    with pytest.raises(RuntimeError, match="'phase': start\\(\\) while it runs"):
        t.start()
    t.stop()
    timers.log(["phase", "absent"])
    assert capsys.readouterr().out.startswith("[Rank 0] time (ms) | phase: ")
    assert NoopTimer()("x").elapsed() == 0

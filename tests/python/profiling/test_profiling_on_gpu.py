"""The flops profiler and the wall-clock timers on a CUDA GPU, where other kernels run: cuDNN's
batch norm, the fused attention kernels, and timers that are CUDA events (Note [Timers and
device syncs] in zerostream/profiling/timers.py). scripts/gpu-check.sh runs it (`-m
device`); without CUDA it skips, as the CPU tests cover the counting and the host timers."""

import time

import pytest
import torch
from test_flops_profiler import CASES, _profile

from zerostream.profiling import SynchronizedWallClockTimer

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# "uncounted" builds a CPU target tensor inside its forward; the others move as they are.
ON_CUDA = [c for c in CASES if c[0] != "uncounted"]


@pytest.mark.parametrize("name, make, inputs, flops, macs", ON_CUDA, ids=[c[0] for c in ON_CUDA])
def test_counts_on_cuda_match_the_hand_count(name, make, inputs, flops, macs):
    torch.manual_seed(0)
    model = make().cuda()
    prof = _profile(model, *(x.cuda() for x in inputs()))
    assert (prof.get_total_flops(), prof.get_total_macs()) == (flops, macs)
    assert prof.get_total_duration() > 0


def test_a_timer_is_the_devices_time_between_two_events():
    torch.cuda.init()
    timer = SynchronizedWallClockTimer()("kernel")
    torch.cuda.synchronize()
    host = time.perf_counter()
    timer.start()
    torch.cuda._sleep(200_000_000)  # a kernel that spins for 200M cycles (~0.1 s)
    timer.stop()
    host_ms = 1000 * (time.perf_counter() - host)
    device_ms = timer.elapsed()  # waits for the stop event
    # Starting and stopping did not wait for the kernel; the timer saw it run.
    assert device_ms > 20 and host_ms < device_ms / 2

"""How often a step makes the host wait for the device, on one rank (what one GPU runs).

On a GPU: torch's sync debug mode (torch.cuda.set_sync_debug_mode("warn")) warns at every
call that makes the host wait for the device (`.item()`, a blocking download, ...). On the
simulated device: its host-read counters (zerostream/testing/sim_compute.py, Note [The
compute pseudo-lane]) over each step (testing/step_budget.py). Stages 2 and 3 with the
optimizer, and at stage 3 the parameters, offloaded to the host: every step after the first
waits once, for the test's own read of the loss (which also shows that the count sees a
read of device memory); the engine's step makes the host wait nowhere (the squared norm
that decides clipping is summed from the host partitions). One rank has no late-part flags
to agree on and no gather rounds (test_gpu_path.py budgets those on two).

scripts/gpu-check.sh runs it (`-m device`).
"""

import os
import warnings

import pytest
import torch
from test_gpu_path import BUDGETED

from multirank import run_ranks
from tiny_gpt import TinyGPT, make_batches

ON_GPU = torch.cuda.is_available() and os.environ.get("ZS_TEST_DEVICE", "") != "sim"
STEPS = 4
HOST_WAITS = 1  # the test's read of the loss
# test_gpu_path's budgeted kinds that one GPU runs without a disk tier
CASES = {name: BUDGETED[name] for name in ("stage2_cpu", "stage3_cpu")}


def _config(stage: int, zero: dict) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "bf16": {"enabled": ON_GPU},
        "zero_optimization": {"stage": stage, **zero},
    }


def _step(engine, x, y) -> float:
    loss = engine(x.to(engine.device), y.to(engine.device))
    engine.backward(loss)
    engine.step()
    return _read_loss(loss)


def _read_loss(loss) -> float:
    return float(loss.detach())  # a wait for the device: the loss is the device's


def _on_gpu(engine, xs, ys) -> list:
    """Per step: where each synchronizing call was made (the warnings' file:line)."""
    per_step = []
    torch.cuda.set_sync_debug_mode("warn")
    try:
        for s in range(STEPS):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _step(engine, xs[s], ys[s])
            per_step.append(
                [
                    f"{os.path.basename(w.filename)}:{w.lineno}"
                    for w in caught
                    if "synchroniz" in str(w.message)
                ]
            )
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return per_step


def _on_sim(engine, xs, ys, sim) -> list:
    from zerostream.testing.step_budget import StepCounters

    counted = StepCounters(sim)
    for s in range(STEPS):
        _step(engine, xs[s], ys[s])
        counted.step_done()
    over = counted.over(
        registrations=0, blocking_downloads=0, pageable_copies=0, host_reads=HOST_WAITS
    )
    assert over == [], over
    return [[site for site, n in sites.items() for _ in range(n)] for sites in counted.read_sites]


def worker(rank, world, on_gpu):
    import zerostream
    from zerostream.testing import sim_device

    xs, ys = make_batches(STEPS, 4)
    out = {}
    for name, (stage, zero) in CASES.items():
        torch.manual_seed(0)
        if on_gpu:
            engine, *_ = zerostream.initialize(model=TinyGPT(), config=_config(stage, zero))
            out[name] = _on_gpu(engine, xs, ys)
            engine.destroy()
            continue
        with sim_device.installed(policy="lazy", device_index=rank, track_memory=True) as sim:
            engine, *_ = zerostream.initialize(model=TinyGPT(), config=_config(stage, zero))
            out[name] = _on_sim(engine, xs, ys, sim)
            engine.destroy()
    return out


@pytest.mark.device
@pytest.mark.multirank
@pytest.mark.timeout(600)
def test_offloaded_steps_make_the_host_wait_for_the_device_only_where_the_test_reads():
    (out,) = run_ranks(worker, 1, ON_GPU, timeout=540)
    for name, per_step in out.items():
        assert len(per_step) == STEPS, (name, per_step)
        for s, sites in enumerate(per_step[1:], start=2):
            assert len(sites) == HOST_WAITS, f"{name}, step {s}: the host waited at {sites}"
            assert all("test_device_syncs.py" in site for site in sites), (name, s, sites)

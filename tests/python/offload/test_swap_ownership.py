"""Two jobs on one nvme_path (reliability issue, item 1): the second fails at initialize
naming the directory and the holder's pid, the first job's swap bytes are untouched, and a
job's swap files and lock go away when it closes its stores (or exits)."""

import errno
import os
import subprocess
import sys
import textwrap

import torch

from zerostream.offload.io_engine import IoEngine
from zerostream.offload.swap_store import SwapStore

SECOND_JOB = textwrap.dedent(
    """
    import sys, torch, zerostream
    cfg = {"train_micro_batch_size_per_gpu": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": 2, "offload_optimizer":
                                 {"device": "nvme", "nvme_path": sys.argv[1]}}}
    try:
        zerostream.initialize(model=torch.nn.Linear(8, 8), config=cfg)
    except OSError as exc:
        print("ERRNO", exc.errno)
        print("MESSAGE", exc)
        sys.exit(3)
    """
)


def test_a_second_job_on_a_held_swap_directory_fails_naming_the_holder(tmp_path):
    first = SwapStore(IoEngine(), str(tmp_path), rank=0, name="optimizer")
    values = torch.arange(4096, dtype=torch.float32)
    first.write(1, values).wait()
    done = subprocess.run(
        [sys.executable, "-c", SECOND_JOB, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stdout + done.stderr[-2000:]
    assert f"ERRNO {errno.EBUSY}" in done.stdout
    assert first.directory in done.stdout and f"pid {os.getpid()}" in done.stdout
    back = torch.empty_like(values)
    first.read(1, back).wait()
    assert torch.equal(back, values)  # the first job lost nothing
    first.close()
    assert not os.path.exists(first.directory)  # files and lock gone with the job


def test_stores_left_open_are_closed_at_exit(tmp_path):
    script = (
        "import sys, torch\n"
        "from zerostream.offload.io_engine import IoEngine\n"
        "from zerostream.offload.swap_store import SwapStore\n"
        "s = SwapStore(IoEngine(), sys.argv[1], rank=0, name='params')\n"
        "s.write(1, torch.ones(1024)).wait()\n"
        "keep = [s]; keep.append(keep)  # a reference cycle, as engines have\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=120)
    leftover = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path) for f in fs]
    assert leftover == []


def destroy_worker(rank, world, nvme):
    import zerostream

    torch.manual_seed(0)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,
            "offload_param": {"device": "nvme", "nvme_path": nvme, "max_in_cpu": 0},
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme},
        },
    }
    engine, _, _, _ = zerostream.initialize(model=torch.nn.Linear(64, 64), config=config)
    loss = engine(torch.ones(1, 64)).sum()
    engine.backward(loss)
    engine.step()
    before = sorted(os.listdir(f"{nvme}/zerostream/rank0"))
    engine.destroy()
    after = [os.path.join(r, f) for r, _, fs in os.walk(nvme) for f in fs]
    return before, after


def test_engine_destroy_deletes_the_swap_files(tmp_path):
    from multirank import run_ranks

    before, after = run_ranks(destroy_worker, 1, str(tmp_path), timeout=120)[0]
    assert before == ["optimizer", "params"]
    assert after == []

"""Blocking calls release the GIL: another Python thread makes progress meanwhile."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from zerostream.offload.host_buffers import HostArena
from zerostream.ops.aio import AsyncIOBuilder


class Counter(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.count = 0
        self.stop = False

    def run(self):
        while not self.stop:
            self.count += 1


@pytest.mark.timeout(60)
def test_wait_releases_the_gil(tmp_path):
    # Many tiny sequential pieces (4 KiB, depth 1) keep wait() blocked for a while.
    h = AsyncIOBuilder().load().aio_handle(4096, 1, False, True, 1)
    # Page-aligned, so the pieces really go to the device with O_DIRECT.
    t = h.new_cpu_locked_tensor(16 << 20, torch.empty(0, dtype=torch.uint8))
    counter = Counter()
    counter.start()
    # Baseline: how fast the counter runs while this thread sleeps (GIL free).
    c0, t0 = counter.count, time.monotonic()
    time.sleep(0.2)
    rate = (counter.count - c0) / (time.monotonic() - t0)
    # A fast drive finishes one write too quickly to tell; queue more until wait() blocks
    # long enough to compare rates.
    for writes in (1, 4, 16):
        for i in range(writes):
            h.async_pwrite(t, str(tmp_path / f"g{i}.bin"))
        before = counter.count
        start = time.monotonic()
        assert h.wait() == writes
        elapsed = time.monotonic() - start
        progressed = counter.count - before
        if elapsed > 0.1:
            break
    counter.stop = True
    counter.join()
    print(
        f"wait() blocked {elapsed:.3f}s; the other thread counted {progressed} "
        f"({progressed / (rate * elapsed):.0%} of its free-running rate)"
    )
    assert elapsed > 0.1, "the write finished too fast to tell"
    # Holding the GIL would leave the counter at most a switch interval (5 ms) or two.
    assert progressed > 0.2 * rate * elapsed


@pytest.mark.timeout(60)
def test_arena_backpressure_releases_the_gil():
    arena = HostArena(1 << 20)
    held = arena.empty(1 << 20)
    got = []

    def taker():
        got.append(arena.empty(1 << 19, timeout_s=30))

    th = threading.Thread(target=taker)
    th.start()
    time.sleep(0.1)  # taker is blocked in allocate; we must still run to release
    assert not got
    del held
    th.join(30)
    assert got and got[0].numel() == 1 << 19
    assert arena.stats()["waits"] == 1


def test_arena_timeout_names_budget_and_request():
    arena = HostArena(1 << 20)
    held = arena.empty(1 << 20)  # noqa: F841
    with pytest.raises(RuntimeError, match=r"request for 8192 bytes.*budget of 1048576"):
        arena.empty(8192, timeout_s=0.05)


def test_low_memlock_limit_degrades_to_unlocked_memory_with_one_warning():
    """Without CAP_IPC_LOCK and with `ulimit -l` 64 KiB, mlock fails: the arena still hands
    out (unlocked) memory and says so once on stderr."""
    import os
    import shutil
    import subprocess
    import sys

    if not (shutil.which("setpriv") and shutil.which("prlimit")):
        pytest.skip("setpriv/prlimit (util-linux) not installed")
    code = (
        "from zerostream.offload.host_buffers import HostArena\n"
        "a = HostArena(16 << 20)\n"
        "x = a.empty(1 << 20); y = a.empty(1 << 20); x.fill_(3)\n"
        "print('unlocked', a.stats()['unlocked'], int(x.sum()))\n"
    )
    cmd = [
        "prlimit",
        "--memlock=65536:65536",
        "setpriv",
        "--inh-caps=-ipc_lock",
        "--bounding-set=-ipc_lock",
        sys.executable,
        "-c",
        code,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    if r.returncode != 0 and "setpriv" in r.stderr:
        pytest.skip(f"cannot drop CAP_IPC_LOCK here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"unlocked 2 {3 << 20}"
    assert r.stderr.count("mlock refused") == 1, r.stderr

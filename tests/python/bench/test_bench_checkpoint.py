"""`zerostream bench checkpoint`: save and load of a real ZeRO-2 optimizer state timed against
fio on the same directory in the same run (benchmarks/checkpoint.md). Checks what it reports
against arithmetic of its own: 12 bytes of fp32 state per parameter, GB/s = bytes / seconds,
ratios = ours / fio's."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from prerequisites import missing


@pytest.mark.slow  # a benchmark's own run: the slow tier
@pytest.mark.timeout(240)
def test_bench_checkpoint_reports_consistent_rates_against_fio(tmp_path):
    if shutil.which("fio") is None:
        missing("fio is not installed (scripts/setup.sh installs it)")
    out = subprocess.run(
        [sys.executable, "-m", "zerostream.cli", "bench", "checkpoint", "--path", str(tmp_path),
         "--params", "17M", "--repeats", "1", "--aio", '{"queue_depth": 16}', "--json"],
        capture_output=True, text=True, timeout=220, check=True, env=dict(os.environ),
    )  # fmt: skip
    res = json.loads(out.stdout)
    assert res["config"]["aio"] == {"queue_depth": 16}
    assert [r["offload"] for r in res["results"]] == ["cpu", "nvme"]
    for r in res["results"]:
        assert r["optimizer_state_bytes"] == 12 * r["params"] and r["params"] >= 16_777_216
        assert r["bytes"] > r["optimizer_state_bytes"]  # plus the bf16 model file
        for op, fio in (("save", "fio_write_direct"), ("load", "fio_read_direct")):
            assert math.isclose(r[f"{op}_gbps"], r["bytes"] / r[f"{op}_s"] / 1e9, rel_tol=1e-6)
            assert r[fio] > 0
            assert math.isclose(r[f"{op}_vs_fio_direct"], r[f"{op}_gbps"] / r[fio], rel_tol=1e-6)
            # The state streams (checkpoint/stream.py): neither save nor load holds a whole
            # copy of it beside the run's own (the unstreamed path took >= 8 bytes/param).
            assert 0 <= r[f"{op}_extra_rss"] < r["optimizer_state_bytes"] / 2, (op, r)
        # With nvme the save reads the whole state from the swap files and the load writes
        # it back (counted by the swapper); the disk-work ratio prices those bytes at fio's.
        swap = r["optimizer_state_bytes"] if r["offload"] == "nvme" else 0
        assert r["save_swap_bytes"] == swap and r["load_swap_bytes"] == swap, r
        read, write = r["fio_read_direct"] * 1e9, r["fio_write_direct"] * 1e9
        fio_save = swap / read + r["bytes"] / write
        fio_load = r["bytes"] / read + swap / write
        assert math.isclose(r["save_vs_fio_disk"], fio_save / r["save_s"], rel_tol=1e-6)
        assert math.isclose(r["load_vs_fio_disk"], fio_load / r["load_s"], rel_tol=1e-6)
        # fio read the checkpoint's own files beside the load; with nvme the load also writes
        # the swap files, which only "vs disk work" prices.
        assert r["fio_read_files"] > 0
        if r["offload"] == "cpu":
            want = r["load_gbps"] / r["fio_read_files"]
            assert math.isclose(r["load_vs_fio_files"], want, rel_tol=1e-6), r
        else:
            assert "load_vs_fio_files" not in r, r
        # The bf16 weights are read straight into the module too: a load holds no second copy.
        assert r["load_extra_rss"] < r["params"], r


@pytest.mark.parametrize("text", ["[1]", "{queue_depth: 8}"])
def test_bench_checkpoint_refuses_an_aio_section_that_is_not_a_json_object(text, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "zerostream.cli", "bench", "checkpoint", "--path", str(tmp_path),
         "--aio", text],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "--aio:" in out.stderr, out.stderr

"""`zerostream estimate` uses this machine's measurements by default: each benchmark leaves its
result in $ZEROSTREAM_CACHE_DIR and the planner names it as the source of the rate."""

import json
import os
import subprocess
import sys

import pytest


def _zs(args, cache, **kw):
    env = {**os.environ, "ZEROSTREAM_CACHE_DIR": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "zerostream.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
        **kw,
    )


@pytest.mark.slow  # runs bench io against the disk: the slow tier
def test_bench_io_result_becomes_the_planners_disk_rate(tmp_path):
    cache = tmp_path / "cache"
    bench = json.loads(
        _zs(
            ["bench", "io", "--path", str(tmp_path / "disk"), "--size", "16M", "--loops", "1",
             "--no-fio", "--json"],
            cache,
        ).stdout
    )  # fmt: skip
    saved = cache / "bench-io.json"
    assert json.loads(saved.read_text())["read_gbps"] == bench["read_gbps"] > 0

    plan = json.loads(
        _zs(
            ["estimate", "--params", "1B", "--gpus", "1", "--gpu-mem", "40GB", "--json"], cache
        ).stdout
    )
    rates = plan["machine"]["rates"]
    for op in ("read", "write"):
        assert rates[f"nvme_{op}"]["value"] == bench[f"{op}_gbps"]
        assert rates[f"nvme_{op}"]["source"] == f"measured: {saved}"

    ignored = json.loads(
        _zs(["estimate", "--params", "1B", "--gpus", "1", "--gpu-mem", "40GB", "--json",
             "--no-cache"], cache).stdout
    )  # fmt: skip
    assert ignored["machine"]["rates"]["nvme_read"]["source"] != f"measured: {saved}"

"""`zerostream bench io` end to end on a small file: JSON keys, fio ratios, sweep output."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from zerostream.bench import io as bench_io


def _run(capsys, *argv) -> dict:
    assert bench_io.main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_the_documented_keys_and_ratios(tmp_path, capsys):
    out = _run(
        capsys,
        "--path",
        str(tmp_path),
        "--size",
        "8M",
        "--block-size",
        "1M",
        "--queue-depth",
        "8",
        "--loops",
        "1",
        "--json",
    )
    for key in (
        "read_gbps",
        "write_gbps",
        "fio_read_gbps",
        "fio_write_gbps",
        "read_ratio_vs_fio",
        "write_ratio_vs_fio",
    ):
        assert key in out
    assert out["read_gbps"] > 0 and out["write_gbps"] > 0
    assert out["config"]["block_size"] == 1 << 20 and out["config"]["o_direct"]
    if shutil.which("fio"):
        assert out["fio_read_gbps"] > 0
        assert out["read_ratio_vs_fio"] == pytest.approx(
            out["read_gbps"] / out["fio_read_gbps"], rel=1e-3
        )
    assert not (tmp_path / "zs_bench_io.dat").exists()  # cleaned up
    # The checksums' cost: the swap store with and without them, on the same workload.
    c = out["checksums"]
    for op in ("read", "write"):
        assert c[f"store_{op}_gbps"] > 0 and c[f"store_{op}_checksummed_gbps"] > 0
        assert c[f"checksum_cost_{op}"] == pytest.approx(
            1 - c[f"store_{op}_checksummed_gbps"] / c[f"store_{op}_gbps"], abs=1e-3
        )
    assert c["crc32c_gbps_one_core"] > 0.1
    assert not (tmp_path / "zerostream").exists()  # the stores' files are gone too


def test_sweep_prints_an_aio_block(tmp_path, capsys):
    out = _run(
        capsys,
        "--path",
        str(tmp_path),
        "--size",
        "4M",
        "--loops",
        "1",
        "--write",
        "--sweep",
        "--json",
    )
    assert len(out["sweep"]) == 18
    assert set(out["aio"]) == {
        "block_size",
        "queue_depth",
        "intra_op_parallelism",
        "single_submit",
        "overlap_events",
    }
    assert out["best"]["sum"] == max(r["sum"] for r in out["sweep"])


def test_sizes_parse_like_fio():
    assert bench_io.parse_size("4G") == 4 << 30
    assert bench_io.parse_size("1M") == 1 << 20
    assert bench_io.parse_size("512k") == 512 << 10
    assert bench_io.parse_size("4096") == 4096
    with pytest.raises(argparse.ArgumentTypeError, match="expected a size like 4G"):
        bench_io.parse_size("lots")

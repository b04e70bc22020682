"""`zerostream bench optim` runs end to end on a tiny size and reports the documented keys
(a smoke test of the plumbing; the numbers themselves are benchmarks, not tests)."""
from __future__ import annotations

import argparse
import json

import pytest

from zerostream.bench import optim as bench


def _parse(argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("optimizer", ["adamw", "lion"])
def test_json_report_has_the_documented_keys(optimizer, capsys):
    args = _parse(["--numel", "1e5", "--optimizer", optimizer, "--repeats", "1", "--json"])
    assert bench.run(args) == 0
    res = json.loads(capsys.readouterr().out)
    for key in ("params_per_s", "gbps", "roofline_gbps", "ratio_vs_roofline",
                "ratio_vs_torch_fused", "ratio_vs_deepspeed", "bytes_per_param"):
        assert key in res, key
    assert res["params_per_s"] > 0 and res["roofline_gbps"] > 0
    assert res["bytes_per_param"] == (28 if optimizer == "adamw" else 20)
    if optimizer == "adamw":
        assert res["ratio_vs_torch_fused"] > 0
    else:
        assert res["ratio_vs_torch_fused"] is None  # torch has no Lion


def test_table_states_the_bytes_model(capsys):
    assert bench.main(["--numel", "5e4", "--repeats", "1", "--no-torch"]) == 0
    out = capsys.readouterr().out
    assert "bytes/param model" in out and "ratio vs roofline" in out


def test_bad_numel_is_rejected():
    with pytest.raises(SystemExit):
        _parse(["--numel", "abc"])

"""`zerostream bench optim` runs end to end on a tiny size and reports the documented keys
(a smoke test of the plumbing; the numbers themselves are benchmarks, not tests)."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

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
    for key in (
        "params_per_s",
        "gbps",
        "roofline_gbps",
        "ratio_vs_roofline",
        "ratio_vs_torch_fused",
        "ratio_vs_deepspeed",
        "bytes_per_param",
    ):
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
    assert "bytes/param model" in out and "vs roofline" in out


def test_ratios_are_paired_within_rounds():
    # The machine slows 4x over three rounds; within each round ours is 2x the peer. The
    # paired ratio sees 2x; a ratio of medians would see 2x only by luck of the order.
    ours = bench._Peer("zerostream", None, 28, "")
    peer = bench._Peer("torch", None, 28, "")
    ours.times, peer.times = [1.0, 2.0, 4.0], [2.0, 4.0, 8.0]
    assert bench._paired(ours, peer) == pytest.approx(2.0)
    assert bench._paired(ours, None) is None
    peer.times = [8.0, 2.0, 4.0]  # medians equal (4 vs 2): per round 8x, 1x, 1x
    assert bench._paired(ours, peer) == pytest.approx(1.0)
    probe_a = bench._Peer("roofline (a)", None, 28, "")
    probe_b = bench._Peer("roofline (b)", None, 28, "")
    probe_a.times, probe_b.times = [0.5, 4.0, 4.0], [1.0, 1.0, 8.0]
    # Best probe per round: 0.5 s, 1.0 s, 4.0 s -> ours at 0.5, 0.5, 1.0 of it.
    assert bench._paired_roofline(ours, [probe_a, probe_b]) == pytest.approx(0.5)
    # The peer took 8, 2, 4 s: a kernel as fast as the best probe is 16x, 2x, 1x faster.
    assert bench._paired_ceiling(ours, [probe_a, probe_b], peer) == pytest.approx(2.0)
    assert bench._paired_ceiling(ours, [probe_a, probe_b], None) is None


def test_model_mode_steps_the_model_list_against_torch(capsys):
    args = _parse(["--model", "gpt2-tiny", "--repeats", "2", "--json"])
    assert bench.run(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["config"]["tensors"] == 2 + 12 * 2 + 2
    names = [p["name"] for p in res["peers"]]
    assert names[:3] == [
        "zerostream DeepSpeedCPUAdam",
        "torch AdamW(fused=True)",
        "torch AdamW(foreach=True)",
    ]
    assert res["ratio_vs_torch_fused"] > 0 and res["params_per_s"] > 0
    with pytest.raises(ValueError, match="--model"):
        bench.run(_parse(["--model", "gpt2-tiny", "--optimizer", "lion"]))


def test_gpt2_small_has_the_real_parameter_count():
    from zerostream.bench.optim_model import MODELS

    shapes = MODELS["gpt2-small"]()
    assert len(shapes) == 148
    assert sum(torch.Size(s).numel() for s in shapes) == 124_439_808  # HF GPT2Model


def test_bad_numel_is_rejected():
    with pytest.raises(SystemExit):
        _parse(["--numel", "abc"])

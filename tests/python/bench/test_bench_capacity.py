"""`zerostream bench capacity` at a small size: parameters and optimizer state really go to
the swap files, every tier's traffic is reported, the peak RSS is checked against the host
budget the configuration implies; and the bench GPT built under zero.Init has the weights a
plain build from the same seed has. No timing is asserted."""

import json
import subprocess
import sys

import pytest
import torch

from multirank import run_ranks
from zerostream.bench.gpt import GPTShape

# hidden 256: the big matrices exceed the persistence threshold (1e5) and go to disk.
SHAPE = ["--layers", "2", "--hidden", "256", "--heads", "4", "--vocab", "512", "--seq", "16"]


@pytest.mark.slow  # a benchmark's own run: the slow tier
@pytest.mark.timeout(300)
def test_capacity_bench_moves_both_tiers_and_reports_the_budget(tmp_path):
    cmd = [sys.executable, "-m", "zerostream.cli", "bench", "capacity", *SHAPE, "--steps", "2"]
    cmd += ["--sub-group-size", "1e5", "--buffer-size", "1e5", "--max-live", "1e6"]
    cmd += ["--nvme-path", str(tmp_path), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(done.stdout.strip().splitlines()[-1])
    assert res["params"] == GPTShape(2, 256, 4, 512, 16).params
    assert res["model_states_gib"] == round(16 * res["params"] / 2**30, 2)
    moved = res["last_step_moved"]
    for tier in ("param_nvme_read", "param_nvme_write", "nvme_read", "nvme_write"):
        assert moved[tier]["gib"] > 0, (tier, moved)
    # Forward and backward each read every swapped shard once; the step writes them all.
    assert moved["param_nvme_read"]["gib"] >= moved["param_nvme_write"]["gib"]
    assert res["param_swap"]["in_cpu_numel"] == 0  # max_in_cpu 0: every big shard on disk
    assert res["verdict"]["rss_within_budget"], res
    assert len(res["losses"]) == 2 and all(x == x for x in res["losses"])


def build_worker(rank, world):
    import zerostream
    from zerostream.bench.gpt import GPT
    from zerostream.zero import GatheredParameters

    shape = GPTShape(2, 64, 4, 128, 16)
    torch.manual_seed(0)
    config = {
        "train_batch_size": world,  # zero.Init checks the batch rule against the world
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    with zerostream.zero.Init(config_dict_or_path=config, dtype=torch.float32):
        model = GPT(shape)
    out = {}
    for name, p in model.named_parameters():
        with GatheredParameters(p):
            out[name] = p.detach().clone()
    return out


@pytest.mark.multirank
def test_the_bench_gpt_built_under_zero_init_equals_a_plain_build():
    from zerostream.bench.gpt import GPT

    weights = run_ranks(build_worker, 2, timeout=120)[0]
    torch.manual_seed(0)
    plain = GPT(GPTShape(2, 64, 4, 128, 16))
    for name, p in plain.named_parameters():
        assert torch.equal(weights[name], p.detach()), name


@pytest.mark.slow  # a benchmark's own run: the slow tier
@pytest.mark.timeout(600)
def test_capacity_compare_tiers_moves_fewer_disk_bytes_for_the_same_losses(tmp_path):
    """--compare-tiers: all on NVMe and tiered in two processes, fio in the same run; the
    tiered run keeps optimizer state in host memory, so its step reads and writes 24 bytes an
    element less of it, and its losses are the all-NVMe run's."""
    cmd = [sys.executable, "-m", "zerostream.cli", "bench", "capacity", *SHAPE, "--steps", "2"]
    cmd += ["--sub-group-size", "1e5", "--buffer-size", "1e5", "--max-live", "1e6", "--bf16"]
    cmd += ["--compare-tiers", "--optimizer-max-in-cpu", "4e5", "--param-max-in-cpu", "0"]
    cmd += ["--nvme-path", str(tmp_path)]
    done = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(done.stdout.strip().splitlines()[-1])
    a, t = res["runs"]["all_nvme"], res["runs"]["tiered"]
    assert a["optimizer_tiers"]["host_elements"] == 0
    host = t["optimizer_tiers"]["host_elements"]
    assert 0 < host <= 4 * 10**5
    saved = 12 * host  # bytes per step, each way
    for way, tier in (("read", "nvme_read"), ("written", "nvme_write")):
        assert a["disk_bytes_per_step"][way] > t["disk_bytes_per_step"][way]
        moved = a["last_step_moved"][tier]["bytes"] - t["last_step_moved"][tier]["bytes"]
        assert moved == saved, (way, moved, saved)
    assert res["same_losses"] and len(a["losses"]) == 2
    assert res["disk"]["read_gb_per_s"] > 0 and t["floor_seconds"] < a["floor_seconds"]
    assert res["disk"]["concurrent_read_gb_per_s"] > 0 and res["disk"]["queue_depth"] == 32
    assert len(res["disk_samples"]) == 2
    # Each step's RSS; each step's own peak once every tier is placed (element counts: from
    # the first step's end on), none predicted without "auto".
    assert len(t["step_rss_gib"]) == 2 and t["step_peak_rss_gib"][0] is None
    assert 0 < t["step_rss_gib"][1] <= t["step_peak_rss_gib"][1] <= t["peak_rss_gib"] + 0.01
    assert t["predicted_peak_rss_gib"] is None and t["auto_host_ceiling_gib"] is None
    # Each step's phases and disk bytes; the last one is the last step's.
    assert len(t["step_phases"]) == 2 and t["step_phases"][-1]["step"] > 0
    assert t["step_phases"][-1]["nvme_read_gb"] == round(
        t["last_step_moved"]["nvme_read"]["bytes"] / 1e9, 3
    )


def test_the_disk_bound_floor_is_the_slowest_of_three_bounds():
    """Note [The disk-bound floor]: reading alone, writing alone, or both directions at the
    disk's combined rate, whichever takes longest."""
    from zerostream.bench.tier_compare import floor_seconds

    disk = {
        "read_gb_per_s": 0.8,
        "write_gb_per_s": 2.0,
        "concurrent_read_gb_per_s": 0.7,
        "concurrent_write_gb_per_s": 0.6,
    }
    # Balanced: 20 GB each way at 1.3 GB/s combined (30.8 s) beats 20 / 0.8 (25 s).
    assert abs(floor_seconds(20 * 10**9, 20 * 10**9, disk) - 40 / 1.3) < 1e-9
    # Reads only: the read rate alone bounds it (the combined rate is higher).
    assert abs(floor_seconds(20 * 10**9, 0, disk) - 25.0) < 1e-9
    # Mostly writes: 30 GB at 2 GB/s (15 s) against 31 GB at 1.3 (23.8 s).
    assert abs(floor_seconds(10**9, 30 * 10**9, disk) - 31 / 1.3) < 1e-9


def test_compare_tiers_times_the_steps_after_every_tier_was_placed():
    from zerostream.bench.tier_compare import _steady_steps

    times = [9.0, 8.0, 9.5, 8.5, 12.0, 4.0, 4.2]
    # "auto": placed during step 5 (index 4, its end is the first settled): steps 6-7 count.
    settled = [False] * 4 + [True] * 3
    assert _steady_steps({"step_seconds": times, "tiers_settled_after_step": settled}) == [
        4.0,
        4.2,
    ]
    # Nothing to place (all on NVMe): every step but the first.
    assert (
        _steady_steps({"step_seconds": times, "tiers_settled_after_step": [True] * 7})
        == (times[1:])
    )
    # Placed only at the last step, or never reported: the last half.
    late = times[3:]
    assert (
        _steady_steps({"step_seconds": times, "tiers_settled_after_step": [False] * 6 + [True]})
        == late
    )
    assert _steady_steps({"step_seconds": times}) == late


def test_compare_rounds_alternate_the_order_and_take_the_median_ratio(monkeypatch, tmp_path):
    """--rounds 3: all-NVMe first, then tiered first, then all-NVMe first again (a disk that
    drifts between runs weighs on both configurations); the speedup is the median of the
    rounds' ratios, and the losses must agree in every run."""
    import argparse

    from zerostream.bench import capacity, tier_compare

    order = []
    step = {"all_nvme": [9.0, 10.0, 10.0, 10.0], "tiered": [9.0, 5.0, 5.0, 5.0]}
    slow = iter([1.0, 1.0, 2.0, 1.0, 1.0, 1.0])  # round 1's tiered run met a slow disk

    def child(args, opt, par, nvme):
        name = "all_nvme" if (opt, par) == ("0", "0") else "tiered"
        order.append(name)
        k = next(slow)
        moved = {"nvme_read": {"bytes": 10**9}, "nvme_write": {"bytes": 10**9}}
        return {
            "step_seconds": [x * k for x in step[name]],
            "tiers_settled_after_step": [True] * 4,
            "losses": [1.0, 0.9],
            "last_step_moved": moved,
        }

    monkeypatch.setattr(tier_compare, "_child", child)
    # fio before the runs and after: each rate is taken at its best of the two (a slow
    # moment of a shared disk must not raise the floor).
    # The concurrent pair comes whole from the sample with the higher sum (0.7 + 0.3 here):
    # 0.7 + 0.4 would mix the two samples into a rate the disk never showed.
    first = {"concurrent_read_gb_per_s": 0.7, "concurrent_write_gb_per_s": 0.3}
    second = {"concurrent_read_gb_per_s": 0.5, "concurrent_write_gb_per_s": 0.4}
    samples = iter(
        [
            {"read_gb_per_s": 1.0, "write_gb_per_s": 0.25, **first},
            {"read_gb_per_s": 0.5, "write_gb_per_s": 1.0, **second},
        ]
    )
    monkeypatch.setattr(tier_compare, "measure_disk", lambda *a, **k: next(samples))
    p = argparse.ArgumentParser()
    capacity.add_arguments(p)
    args = p.parse_args(["--compare-tiers", "--rounds", "3", "--nvme-path", str(tmp_path)])
    res = tier_compare.compare(args)
    assert order == ["all_nvme", "tiered", "tiered", "all_nvme", "all_nvme", "tiered"]
    assert [r["first"] for r in res["rounds"]] == ["all_nvme", "tiered", "all_nvme"]
    assert [r["speedup"] for r in res["rounds"]] == [2.0, 1.0, 2.0]
    assert res["tiered_speedup"] == 2.0 and res["same_losses"]
    assert len(res["disk_samples"]) == 2
    assert res["disk"] == {"read_gb_per_s": 1.0, "write_gb_per_s": 1.0, **first}
    # 1 GB read and 1 GB written: 1 s each way alone, 2 GB at 0.7 + 0.3 GB/s together.
    assert res["runs"]["all_nvme"]["floor_seconds"] == 2.0


def test_the_bench_takes_each_step_s_own_peak_once_every_tier_is_placed(monkeypatch):
    """Each step's peak RSS from the step after the one that placed the last tier: the peak
    restarts at the end of every step from that one on, and a step that began before the
    placement reports none."""
    from zerostream.bench import capacity

    peaks = iter([5 << 30, 6 << 30, 7 << 30])
    restarts = []

    def restart():
        restarts.append(1)
        return next(peaks)

    monkeypatch.setattr(capacity.window, "restart_window_peak", restart)
    settled, got = [], []
    for placed in (False, False, True, True, True):
        settled.append(placed)
        got.append(capacity._placed_step_peak(settled))
    assert got == [None, None, None, 6.0, 7.0]
    assert len(restarts) == 3  # from the step that placed the last tier on


def test_wide_matmul_gives_the_bf16_linear_its_values_and_gradients():
    """bench GPT's WideLinear (--wide-matmul): a bf16 Linear whose GEMMs run in fp32. Output
    and every gradient equal an fp64 reference on the same bf16 values, rounded once to bf16
    (at most one bf16 ulp: fp32 accumulation), as torch's own bf16 Linear does within the
    same bound; fp32 weights take nn.Linear's path unchanged."""
    from zerostream.bench.gpt import GPT, WideLinear

    torch.manual_seed(0)
    lin = WideLinear(48, 24).to(torch.bfloat16)
    x = torch.randn(2, 5, 48, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(2, 5, 24, dtype=torch.bfloat16)
    y = lin(x)
    y.backward(g)
    w, b, x64, g64 = lin.weight.double(), lin.bias.double(), x.detach().double(), g.double()
    want = {
        "y": x64 @ w.t() + b,
        "x": g64 @ w,
        "w": g64.reshape(-1, 24).t() @ x64.reshape(-1, 48),
        "b": g64.reshape(-1, 24).sum(0),
    }
    got = {"y": y, "x": x.grad, "w": lin.weight.grad, "b": lin.bias.grad}
    for name, ref in want.items():
        assert got[name].dtype == torch.bfloat16, name
        ulp = ref.abs().clamp_min(1e-3) * 2**-7  # bf16's 8-bit significand
        assert ((got[name].double() - ref).abs() <= ulp).all(), name
    plain = torch.nn.Linear(48, 24)
    wide = WideLinear(48, 24)
    wide.load_state_dict(plain.state_dict())
    x32 = torch.randn(3, 48)
    assert torch.equal(wide(x32), plain(x32))
    model = GPT(GPTShape(1, 32, 4, 64, 8), wide_matmul=True)
    assert sum(isinstance(m, WideLinear) for m in model.modules()) == 4  # qkv, proj, up, down


def test_the_corpus_option_trains_on_the_demo_s_bytes():
    import argparse

    from zerostream.bench import capacity, tier_compare
    from zerostream.bench.corpus import read_corpus, vocabulary

    p = argparse.ArgumentParser()
    capacity.add_arguments(p)
    args = p.parse_args(["--corpus-mb", "0.25", "--seq", "16", "--micro-batch", "3"])
    assert vocabulary(args.corpus_mb, args.vocab) == 256  # bytes, whatever --vocab says
    assert vocabulary(0, 8192) == 8192  # synthetic tokens keep --vocab
    with pytest.raises(ValueError, match="--corpus-mb"):
        vocabulary(-1, 8192)
    shape = GPTShape(1, 64, 4, vocabulary(args.corpus_mb, args.vocab), args.seq)
    # The compare sizes its fio probe from the same model (one rule, in corpus.py).
    args.layers, args.hidden, args.heads = 1, 64, 4
    assert tier_compare._params(args) == shape.params
    train, _ = read_corpus(0.25)
    text = bytes(train.tolist())
    first = capacity._data(args, shape, "cpu")
    again = capacity._data(args, shape, "cpu")
    for _ in range(3):
        x, y = next(first)
        x2, y2 = next(again)
        assert torch.equal(x, x2) and torch.equal(y, y2)  # the same batches for every peer
        assert x.shape == y.shape == (3, 16) and x.dtype == torch.long
        assert torch.equal(x[:, 1:], y[:, :-1])  # y is x's next byte
        for row_x, row_y in zip(x.tolist(), y.tolist()):
            window = bytes(row_x + row_y[-1:])
            assert window in text  # a real window of the standard library's source
    # The config takes --lr and --warmup-steps as DeepSpeed's optimizer and WarmupLR.
    args = p.parse_args(["--lr", "3e-5", "--warmup-steps", "4"])
    cfg = capacity._config(args, "/nvme")
    assert cfg["optimizer"]["params"]["lr"] == 3e-5
    assert cfg["scheduler"]["params"]["warmup_max_lr"] == 3e-5
    assert cfg["scheduler"]["params"]["warmup_num_steps"] == 4
    assert "scheduler" not in capacity._config(p.parse_args([]), "/nvme")


@pytest.mark.parametrize(
    "flags, state_bytes, states_dtype",
    [([], 12, None), (["--bf16-masters"], 10, False), (["--bf16-states"], 6, True)],
)
def test_capacity_sizes_each_master_precision(flags, state_bytes, states_dtype):
    """The three optimizer-state sizes (Note [16-bit master weights with an offloaded
    optimizer]): the config the bench writes asks for them, and its host budget counts the
    state kept in host memory at that many bytes an element."""
    import argparse

    from zerostream.bench import capacity

    p = argparse.ArgumentParser()
    capacity.add_arguments(p)
    args = p.parse_args(["--bf16", *flags])
    bf16 = capacity._config(args, "/unused")["bf16"]
    assert bf16.get("bf16_optimizer_states") is states_dtype
    assert bf16.get("bf16_master_weights_and_grads", False) is (states_dtype is not None)
    budget = [capacity.host_budget_bytes(10**6, args, held, 0, 4096) for held in (0, 1000)]
    assert budget[1] - budget[0] == state_bytes * 1000

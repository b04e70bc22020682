"""DeepSpeed's estimators: the t5-3b worked example of the reference (deepspeed_compat.md §4,
numbers reproduced there from DeepSpeed's formulas and its published memory.rst), the table
layout, model_to_params on a module whose counts are known by hand, and, where the benchmark
venv has DeepSpeed installed, DeepSpeed's own functions printing the same tables."""

import pathlib
import subprocess

import torch

from prerequisites import require_deepspeed_python
from zerostream import estimate

P, L = 2851 * 10**6, 32 * 10**6  # t5-3b "all_cold": total and largest layer params
REPO = pathlib.Path(__file__).resolve().parents[3]


def test_zero3_worked_example_bytes():
    e3 = estimate.estimate_zero3_model_states_mem_needs
    assert e3(P, L, 8, 1, True, True, True) == (76_977_000_000, 128_000_000, 128_000_000)
    assert e3(P, L, 8, 1, True, False, True)[:2] == (68_424_000_000, 840_750_000)
    assert e3(P, L, 8, 1, False, False, True)[:2] == (1_536_000_000, 6_542_750_000)
    for offload, params in ((True, True), (True, False), (False, False)):
        assert e3(P, L, 8, 1, offload, params, False)[0] == 136_848_000_000


def test_zero2_worked_example_bytes():
    e2 = estimate.estimate_zero2_model_states_mem_needs
    assert e2(P, 8, 1, cpu_offload=True) == (136_848_000_000, 5_702_000_000)
    # The current formula 2P + 18P/G (11.28 GiB), not memory.rst's older 15.93 GiB.
    assert e2(P, 8, 1, cpu_offload=False) == (P * 4 * 8 * 3 // 2, 12_116_750_000)
    # Integer division of the partitioned part, as DeepSpeed truncates it.
    assert e2(1001, 3, 1, cpu_offload=False) == (18018, 8008)


def test_zero3_table_matches_the_worked_example(capsys):
    estimate.estimate_zero3_model_states_mem_needs_all_cold(P, L, num_gpus_per_node=8)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:4] == [
        "Estimated memory needed for params, optim states and gradients for a:",
        "HW: Setup with 1 node, 8 GPUs per node.",
        "SW: Model with 2851M total params, 32M largest layer params.",
        "  per CPU  |  per GPU |   Options",
    ]
    assert lines[4:] == [
        "   71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1",
        "  127.45GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0",
        "   63.72GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=1",
        "  127.45GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=0",
        "    1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1",
        "  127.45GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=0",
    ]


def test_zero2_table_matches_the_worked_example(capsys):
    estimate.estimate_zero2_model_states_mem_needs_all_cold(P, num_gpus_per_node=8)
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "SW: Model with 2851M total params."
    assert lines[4:] == [
        "  127.45GB |   5.31GB | offload_optimizer=cpu",
        "  127.45GB |  11.28GB | offload_optimizer=none",
    ]


def test_multi_node_header_and_per_node_cpu(capsys):
    estimate.estimate_zero3_model_states_mem_needs_all_cold(P, L, 4, 2)
    out = capsys.readouterr().out
    assert "HW: Setup with 2 nodes, 4 GPUs per node." in out
    assert "   35.85GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1" in out


class _Tied(torch.nn.Module):
    """Embedding 1000 x 64 tied to the head, one 64 x 256 MLP layer with bias."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(1000, 64)
        self.up = torch.nn.Linear(64, 256)
        self.head = torch.nn.Linear(64, 1000, bias=False)
        self.head.weight = self.emb.weight


def test_model_to_params_counts_tied_weights_once():
    total, largest = estimate.model_to_params(_Tied())
    assert total == 1000 * 64 + 64 * 256 + 256
    assert largest == 1000 * 64


def test_all_live_is_all_cold_of_the_module_counts(capsys):
    model = _Tied()
    estimate.estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=2)
    live = capsys.readouterr().out
    estimate.estimate_zero3_model_states_mem_needs_all_cold(1000 * 64 + 64 * 256 + 256, 64000, 2)
    assert live == capsys.readouterr().out
    estimate.estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=2)
    live = capsys.readouterr().out
    estimate.estimate_zero2_model_states_mem_needs_all_cold(1000 * 64 + 64 * 256 + 256, 2)
    assert live == capsys.readouterr().out


_DS_SCRIPT = """
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold
for g, n in ((8, 1), (4, 2), (1, 1), (3, 1)):
    estimate_zero2_model_states_mem_needs_all_cold(2851e6, g, n)
    estimate_zero3_model_states_mem_needs_all_cold(2851e6, 32e6, g, n)
    estimate_zero3_model_states_mem_needs_all_cold(68976648192, 262144000, g, n)
"""


def test_same_tables_as_deepspeed(capsys):
    python = require_deepspeed_python()
    done = subprocess.run([python, "-c", _DS_SCRIPT], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = [ln for ln in done.stdout.splitlines() if not ln.startswith("[")]
    for g, n in ((8, 1), (4, 2), (1, 1), (3, 1)):
        estimate.estimate_zero2_model_states_mem_needs_all_cold(2851e6, g, n)
        estimate.estimate_zero3_model_states_mem_needs_all_cold(2851e6, 32e6, g, n)
        estimate.estimate_zero3_model_states_mem_needs_all_cold(68976648192, 262144000, g, n)
    ours = capsys.readouterr().out.splitlines()
    # DeepSpeed >= 0.14 on Python >= 3.11 prints its enum's repr (module doc of
    # zero_estimators.py); everything else, numbers included, is the same text.
    theirs = [
        ln.replace("OffloadDeviceEnum.cpu", "cpu").replace("=cpu,", "=cpu ,") for ln in theirs
    ]
    assert ours == theirs

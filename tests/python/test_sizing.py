"""sizing.py's rules by hand, where a rule has more branches than the estimator's grid
(tests/python/estimate/test_estimate_vs_runtime.py) reaches: each of the five conditions that
make an offloaded gradient partition fp32, persistence cut by the model's total, max_in_cpu's
first-come shards, and the parameter staging arena's floor and ceiling."""

import pytest

from zerostream import sizing


def test_state_bytes_are_12_10_and_6():
    assert sizing.optimizer_state_bytes(False, False) == 12
    assert sizing.optimizer_state_bytes(True, False) == 10
    assert sizing.optimizer_state_bytes(True, True) == 6
    assert sizing.widest_state_bytes(True, False) == 4  # fp32 moments beside bf16 masters


@pytest.mark.parametrize(
    "change",
    [
        {"reads_16bit": False},  # a client's torch optimizer reads fp32 gradients
        {"model_dtype": "fp32"},
        {"accumulation_steps": 2},
        {"offload_gradient_dtype": "fp32"},
        {"grad_accum_dtype": "fp32"},
    ],
)
def test_any_one_condition_makes_offloaded_gradients_fp32(change):
    landing = dict(model_dtype="bf16", accumulation_steps=1)
    assert sizing.offloaded_grad_dtype(**landing) == "bf16"
    assert sizing.offloaded_grad_dtype(**landing, grad_accum_dtype="bf16") == "bf16"
    assert sizing.offloaded_grad_dtype(**{**landing, **change}) == "fp32"
    assert sizing.offloaded_grad_bytes(**{**landing, **change}) == 4


def test_persistence_stops_at_the_models_total_and_max_in_cpu_keeps_the_first_shards():
    # threshold 100: the 32s and the 96 qualify; a total of 100 admits 32 + 32, then not 96
    # (it would make 160), then the last 32 again (96 in all).
    homes = sizing.shard_homes([32, 512, 32, 96, 32, 4096], 2, 100, 100, max_in_cpu=300)
    assert homes.persistent == [True, False, True, False, True, False]
    assert homes.shards == [16, 256, 16, 48, 16, 2048]
    # max_in_cpu 300 keeps the 256-element shard; the 48 would make 304: to disk
    assert homes.in_cpu == [False, True, False, False, False, False]
    assert homes.swapped == [48, 2048]
    assert homes.swapped_bytes(2) == 4096 + 4096  # each shard in whole arena pages
    everything = sizing.shard_homes([32, 512], 1, 0, 2**63 - 1)  # not nvme: nothing swapped
    assert everything.persistent == [False, False] and everything.swapped == []


def test_param_staging_is_the_budget_within_its_floor_and_ceiling():
    page = 4096
    # buffer_count 4 x buffer_size 1024 16-bit elements: 4 pages, below every swapped shard
    assert sizing.param_staging_bytes(100, 4, 1024, 10 * page) == 4 * page
    # never more than every swapped shard (3 pages) ...
    assert sizing.param_staging_bytes(100, 4, 1024, 3 * page) == 3 * page
    # ... but always twice the largest shard (5 pages)
    assert sizing.param_staging_bytes(5 * page, 4, 1024, 10 * page) == 10 * page
    assert sizing.read_ahead_buffer_count(9 * page, 1024) == 9  # 2 KiB: a page a buffer
    assert sizing.read_ahead_buffer_count(9 * page, 4096) == 5  # 8 KiB: 2 pages


def test_the_optimizer_staging_and_copy_slots():
    # buffer_count 6: 2 sets of 3 buffers, each a 1000-element sub-group of 4 bytes (1 page)
    assert sizing.optimizer_staging_bytes(6, 1000, 4) == 2 * 3 * 4096
    assert sizing.optimizer_staging_bytes(1, 1025, 4) == 2 * 3 * 2 * 4096
    assert sizing.copy_slot_bytes(10) == 64 << 10  # at least 64 KiB
    assert sizing.copy_slot_bytes(10**9) == sizing.COPY_SLOT_BYTES  # at most 16 MiB
    assert sizing.copy_stage_bytes(64 << 10) == 4 * (64 << 10)

"""offload_optimizer nvme sizes its staging from free host memory: sub-groups whose buffers
(sets x 3 fp32 tensors) would take more than a quarter of it are cut smaller, with one
warning naming zero_optimization.sub_group_size; results do not depend on the cut (Adam is
elementwise), so nothing else changes."""

import logging
import types

import pytest

from zerostream.offload.optimizer_swap import SwappedAdam


def _fit(monkeypatch, free_bytes, numels, sub_group_size, sets=2, widest=4, agree=None):
    import psutil

    monkeypatch.setattr(
        psutil, "virtual_memory", lambda: types.SimpleNamespace(available=free_bytes)
    )
    fake = types.SimpleNamespace(numels=numels, widest=widest, agree=agree)
    return SwappedAdam._fit_sub_group_size(fake, sub_group_size, sets)


def test_a_sub_group_that_fits_is_kept(monkeypatch):
    assert _fit(monkeypatch, 64 << 30, [10**9], 10**8) == 10**8
    assert _fit(monkeypatch, 64 << 30, [10**6], 0) == 0  # one per param, small params


def test_a_sub_group_too_big_for_free_memory_is_cut_with_one_warning(monkeypatch, caplog):
    free = 24 << 30
    with caplog.at_level(logging.WARNING, logger="zerostream"):
        size = _fit(monkeypatch, free, [3 * 10**9], 10**9)
    assert size == free // 4 // (2 * 3 * 4)  # a quarter of free memory for 2 sets x 3 fp32
    assert 2 * 3 * 4 * size <= free // 4
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "zero_optimization.sub_group_size" in said[0]


def test_bf16_masters_and_moments_fit_twice_the_sub_group():
    """With bf16 masters and moments (widest kind 2 bytes) the staging of a sub-group is half
    as large, so the cut allows twice the elements."""
    import psutil

    free = 24 << 30
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(available=free))
        fake = types.SimpleNamespace(numels=[3 * 10**9], widest=2, agree=None)
        size = SwappedAdam._fit_sub_group_size(fake, 10**9, 2)
    finally:
        mp.undo()
    assert size == free // 4 // (2 * 3 * 2)


@pytest.mark.parametrize("sub_group_size", [0, 10**9])
def test_one_huge_parameter_is_cut_too(monkeypatch, sub_group_size):
    assert _fit(monkeypatch, 8 << 30, [2 * 10**9], sub_group_size) < 2 * 10**9


def test_ranks_that_read_different_free_memory_cut_the_same_sub_groups(monkeypatch):
    """The reading is agreed (comm.agree's minimum over the ranks): two ranks of one node that
    read 24 and 16 GiB both cut as the 16 GiB one would."""
    readings = {0: 24 << 30, 1: 16 << 30}

    def agree(values, op):
        assert op == "min"
        return [min(readings.values())]

    sizes = [_fit(monkeypatch, free, [3 * 10**9], 10**9, agree=agree) for free in readings.values()]
    alone = [_fit(monkeypatch, free, [3 * 10**9], 10**9) for free in readings.values()]
    assert sizes[0] == sizes[1] == alone[1] and alone[0] != alone[1]

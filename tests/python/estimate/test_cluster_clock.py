"""cluster_check's seconds (issue 32 item 5): each collective call's measured time is split
into the wait for the last rank to issue it and the transfer after that, which is what the
planner's ring model predicts. The split is computed by hand here, and the clock is checked
to stamp an asynchronous call when its future completes, not when it is issued or waited."""

import pytest
import torch

from zerostream import comm
from zerostream.bench import cluster_check
from zerostream.bench.cluster_worker import CallClock, training_rates, transfer_split


def _rank(gather, scatter, steps=2, warmup=0, ring=None):
    """A worker's result; a stamp [issued, done] gets 1 MiB and step `warmup`."""

    def full(stamps):
        return [s if len(s) == 4 else [*s, 1 << 20, warmup] for s in stamps]

    stamps = {"all_gather": full(gather), "reduce_scatter": full(scatter)}
    return {"steps": steps, "warmup": warmup, "stamps": stamps, "ring": ring}


def test_the_split_charges_the_wait_for_the_last_rank_to_arrival_and_the_rest_to_transfer():
    # Two calls of each kind over two steps. Gather 1: rank 1 issues 3 s after rank 0 and
    # both finish at 5; gather 2: both issue at 10, finish at 11 and 12.
    ranks = [
        _rank([[0.0, 5.0], [10.0, 11.0]], [[20.0, 21.0]]),
        _rank([[3.0, 5.0], [10.0, 12.0]], [[20.5, 21.5]]),
    ]
    split = transfer_split(ranks)
    g = split["all_gather"]
    assert g["arrival"] == [3.0 / 2, 0.0]
    assert g["transfer"] == [(2.0 + 1.0) / 2, (2.0 + 2.0) / 2]
    assert g["calls"] == 1.0
    s = split["reduce_scatter"]
    assert s["arrival"] == [0.5 / 2, 0.0]
    assert s["transfer"] == [0.5 / 2, 1.0 / 2]  # rank 0 finished 0.5 s after rank 1 issued
    assert s["calls"] == 0.5


def test_warm_up_calls_are_not_measured_but_give_the_links_as_training_loads_them():
    # Warm-up (steps 1..2, step 0 skipped) over 2 ranks: gathers of 1 and 5 MB taking
    # 1 + 1 = 2 ms and 1 + 5 = 6 ms after the last issue (t = 1 ms + 1 ms/MB), and one of
    # 0.5 MB in step 0 that must not count; the measured step (3) has one 2 s gather.
    mb = 1_000_000
    gather = [[0.0, 9.0, mb // 2, 0], [1.0, 1.002, mb, 1], [2.0, 2.006, 5 * mb, 2]]
    scatter = [[5.0, 5.004, mb, 1], [6.0, 6.006, mb, 2]]  # one size: latency only
    ring = {"reduce_scatter": {"gbps": 0.5, "latency_us": 0.0}}
    ranks = [
        _rank([*gather, [10.0, 12.0, mb, 3]], scatter, steps=1, warmup=3, ring=ring)
        for _ in range(2)
    ]
    split = transfer_split(ranks)
    assert split["all_gather"]["transfer"] == [2.0, 2.0]
    assert split["all_gather"]["calls"] == 1.0
    assert split["reduce_scatter"]["calls"] == 0.0
    rates = training_rates(ranks)
    g = rates["all_gather"]  # a = 1 ms over 1 hop; b = 1 ns/B is (N-1)/N over 0.5 GB/s
    assert g["latency_us"] == pytest.approx(1000.0)
    assert g["gbps"] == pytest.approx(0.5)
    assert g["calls"] == 2
    s = rates["reduce_scatter"]  # 0.5 GB/s alone: 1 ms of the 4 and 6 ms is the bytes
    assert s["gbps"] == pytest.approx(0.5)
    assert s["latency_us"] == pytest.approx(4000.0)


def test_ranks_that_issued_different_numbers_of_calls_are_refused_by_kind():
    ranks = [_rank([[0.0, 1.0]], []), _rank([[0.0, 1.0], [2.0, 3.0]], [])]
    with pytest.raises(RuntimeError, match=r"all_gather: the ranks issued \[1, 2\] calls"):
        transfer_split(ranks)


class _Work:
    def __init__(self):
        self.future = torch.futures.Future()

    def get_future(self):
        return self.future


def test_the_clock_stamps_an_async_call_when_its_future_completes(monkeypatch):
    works = []

    def gather(out, send, group=None, async_op=False):
        if not async_op:
            return None
        works.append(_Work())
        return works[-1]

    monkeypatch.setattr(comm, "all_gather_into_tensor", gather)
    out, send = torch.empty(8), torch.empty(4)
    with CallClock() as clock:
        comm.all_gather_into_tensor(out, send)  # synchronous: done when it returns
        work = comm.all_gather_into_tensor(out, send, async_op=True)
        issued, done, payload, step = clock.calls["all_gather"][1]
        assert step == 0
        assert payload == 32  # the gathered side's bytes
        assert done is None  # issued, not complete: the runtime's wait() is not the stamp
        work.get_future().set_result(None)
        assert clock.calls["all_gather"][1][1] >= issued
        sync = clock.calls["all_gather"][0]
        assert sync[0] <= sync[1] <= issued
    assert comm.all_gather_into_tensor is gather  # the runtime's function is back


def test_the_check_reports_the_transfer_error_and_tolerates_results_without_stamps():
    row = {"seconds_predicted": 0.9, "seconds_predicted_loaded": 1.5, "transfer_measured": 1.2}
    assert cluster_check.transfer_error(row) == pytest.approx(0.25)
    assert cluster_check.transfer_error(row, "seconds_predicted") == pytest.approx(-0.25)
    assert cluster_check.transfer_error({"seconds_predicted": 0.9}) == 0.0

"""The comms logger (zerostream/comms_logging.py, DeepSpeed's `comms_logger` section and
`deepspeed.comm.log_summary`): bandwidths by nccl-tests' formulas worked by hand, and on 2
Gloo ranks each collective recorded under its name and input bytes, the filters (prof_all,
prof_ops, prof=, log_name=, debug), the summary printed on rank 0 only, and the section
turning it on through initialize()."""

import contextlib
import io

import pytest
import torch

from mlp import MLP
from multirank import run_ranks


def test_bandwidths_follow_nccl_tests_formulas():
    from zerostream.comm.comms_logging import calc_bw_log

    # 1e6 bytes in 1 ms on 4 ranks: 8 Gbps moved once; an all-reduce's algorithm bandwidth
    # counts it twice, its bus 2(n-1)/n; a gather's counts n inputs, its bus (n-1)/n of that.
    assert calc_bw_log("broadcast", 10**6, 1.0, world=4) == pytest.approx((8.0, 8.0))
    assert calc_bw_log("all_reduce", 10**6, 1.0, world=4) == pytest.approx((16.0, 12.0))
    assert calc_bw_log("all_gather_into_tensor", 10**6, 1.0, world=4) == pytest.approx((32.0, 24.0))
    assert calc_bw_log("reduce_scatter_tensor", 10**6, 2.0, world=4) == pytest.approx((16.0, 12.0))
    assert calc_bw_log("all_to_all_single", 10**6, 1.0, world=4) == pytest.approx((8.0, 6.0))
    assert calc_bw_log("barrier", 0, 1.0, world=4) == (0.0, 0.0)


def test_sizes_and_trimmed_mean():
    from zerostream.comm.comms_logging import convert_size, trim_mean

    assert [convert_size(n) for n in (0, 1000, 1536, 2**20 * 3)] == [
        "0B",
        "1000.0 B",
        "1.5 KB",
        "3.0 MB",
    ]
    data = [100.0] + [float(i) for i in range(1, 19)] + [-100.0]
    kept = data.copy()
    assert trim_mean(data, 0.1) == pytest.approx(sum(range(2, 18)) / 16)  # 2 cut at each end
    assert data == kept  # not sorted in place: the lists of a record stay paired
    assert trim_mean([], 0.1) == 0


def collectives_worker(rank, world):
    from zerostream import comm

    comm.init_distributed(dist_backend="gloo")
    comm.configure(enabled=True, prof_all=True)
    for _ in range(3):
        comm.all_reduce(torch.ones(1000))  # 4000 bytes
    comm.all_gather_into_tensor(torch.empty(20, dtype=torch.float16), torch.ones(10).half())
    comm.reduce_scatter_tensor(torch.empty(4), torch.ones(8))
    comm.all_reduce(torch.ones(5), async_op=True).wait()
    everything = comm.comms_logger.get_raw_data()
    comm.reset_log()
    comm.configure(prof_all=False, prof_ops=["all_gather_into_tensor", "mine"])
    comm.all_reduce(torch.ones(3))  # not profiled now
    comm.all_gather_into_tensor(torch.empty(4), torch.ones(2))
    comm.all_reduce(torch.ones(6), log_name="mine")
    comm.broadcast(torch.ones(7), src=0, prof=True)
    comm.configure(debug=True)
    comm.barrier(prof=True)
    filtered = comm.comms_logger.get_raw_data()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        summary = comm.log_summary(show_straggler=True, return_dict=True)
    after = comm.comms_logger.get_raw_data()
    return everything, filtered, out.getvalue(), summary, after == filtered


@pytest.mark.multirank
def test_two_ranks_record_each_collective_and_print_on_rank_0():
    from zerostream.comm.comms_logging import calc_bw_log

    (everything, filtered, printed, summary, unchanged), (_, _, printed1, _, _) = run_ranks(
        collectives_worker, 2
    )
    assert {name: {size: rec[0] for size, rec in sizes.items()} for name, sizes in
            everything.items()} == {
        "all_reduce": {4000: 3, 20: 1},
        "all_gather_into_tensor": {20: 1},
        "reduce_scatter_tensor": {32: 1},
    }  # fmt: skip
    count, latencies, algbws, busbws = everything["all_reduce"][4000]
    assert all(t > 0 for t in latencies)
    for t, alg, bus in zip(latencies, algbws, busbws):
        assert (alg, bus) == pytest.approx(calc_bw_log("all_reduce", 4000, t, world=2))
    assert sorted(filtered) == [
        "all_gather_into_tensor",
        "barrier | [Caller Func: collectives_worker]",
        "broadcast",
        "mine",
    ]
    assert list(filtered["mine"]) == [24] and list(filtered["broadcast"]) == [28]
    assert unchanged  # the summary's own barriers and straggler all-reduces are not records
    assert printed1 == ""
    lines = printed.splitlines()
    assert lines[0].split() == ["Comm.", "Op", "Message", "Size", "Count", "Total",
                                "Latency(ms)", "Avg", "Latency(ms)", "tput_avg", "(Gbps)",
                                "busbw_avg", "(Gbps)"]  # fmt: skip
    assert "mine" in lines and "Breakdown with straggler effect" in lines
    row = lines[lines.index("mine") + 1].split()
    assert row[:3] == ["24.0", "B", "1"]
    assert summary["summary"]["mine"][24]["count"] == 1
    assert summary["straggler_analysis"]["broadcast"][28]["count"] == 1
    assert summary["metadata"]["world_size"] == 2


def engine_worker(rank, world, section):
    import zerostream
    from zerostream import comm

    torch.manual_seed(0)
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": 2},
    }
    if section is not None:
        cfg["comms_logger"] = section
    engine, *_ = zerostream.initialize(model=MLP(), config=cfg)
    for _ in range(2):
        engine.backward(engine(torch.randn(2, 8)))
        engine.step()
    return comm.comms_logger.enabled, comm.comms_logger.get_raw_data()


@pytest.mark.multirank
def test_the_section_turns_the_logger_on_through_initialize():
    on, records = run_ranks(engine_worker, 2, {"enabled": True})[0]
    assert on and records, "the engine's collectives were not recorded"
    off, none = run_ranks(engine_worker, 2, {"enabled": False, "prof_all": True})[0]
    assert not off and none == {}

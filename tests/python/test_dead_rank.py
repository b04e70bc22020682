"""A rank that dies: the survivors' errors name this rank, the collective and the rank that
stopped answering (Note [Naming the rank that stopped answering] in comm/), from synchronous
calls, from asynchronous handles' wait(), and from stage 2's overlapped reduction. Real
processes on Gloo; the dead rank kills itself (SIGKILL) or exits through Python."""

from __future__ import annotations

import atexit
import datetime
import io
import os
import re
import signal
import sys
import time
import traceback

import pytest
import torch

from multirank import run_ranks

pytestmark = pytest.mark.multirank

_TIMEOUT = datetime.timedelta(seconds=30)  # a dead Gloo peer fails at once; a hang fails here


def _error(call, frames: bool = False):
    """The message of the RuntimeError `call` raises (and, with frames, the functions it
    passed through)."""
    try:
        call()
    except RuntimeError as exc:
        if frames:
            return str(exc), [f.name for f in traceback.extract_tb(exc.__traceback__)]
        return str(exc)
    return "no error"


def _die_after_first_step(rank: int) -> None:
    """Rank 1 SIGKILLs itself; rank 0 gives it a moment, so the next collective meets a dead
    peer rather than a dying one (either is named, this keeps the test's story simple)."""
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)


def killed_peer_worker(rank, world):
    import zerostream
    from zerostream import comm

    comm.init_distributed(timeout=_TIMEOUT)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 16, bias=False), torch.nn.Linear(16, 16, bias=False)
    )
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
        # One bucket per weight, each owned by one rank: both reduce as asynchronous
        # all-reduces, waited on in after_backward (Note [Stage-2 bucket reduction]).
        "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 1},
    }
    engine, *_ = zerostream.initialize(model=model, config=config)
    x = torch.randn(2, 16)
    engine.backward(engine(x).square().mean())
    engine.step()
    _die_after_first_step(rank)

    overlapped = _error(lambda: engine.backward(engine(x).square().mean()), frames=True)
    work = comm.all_reduce(torch.ones(4), async_op=True)
    handle = (type(work).__name__, isinstance(work.is_completed(), bool))
    waited = _error(work.wait)
    sync = _error(lambda: comm.all_reduce(torch.ones(4)))
    return {"overlapped": overlapped, "handle": handle, "waited": waited, "sync": sync}


def _survivor_result(worker, rank1_fate: str):
    """Runs `worker` on two ranks where rank 1 dies as `rank1_fate` says; rank 0's result."""
    rank0, rank1 = run_ranks(worker, 2, timeout=100, expect_failure=True)
    assert rank1 == ("missing", rank1_fate)
    status, payload = rank0
    assert status == "ok", payload
    return torch.load(io.BytesIO(payload))


@pytest.mark.timeout(120)
def test_survivor_names_itself_the_collective_and_the_killed_rank():
    out = _survivor_result(killed_peer_worker, "exit code -9")
    gone = (
        r"rank 1 \(pid \d+ on host [^)]+\) is gone: its process ended without exiting "
        r"Python \(killed, or crashed\); "
    )
    # stage 2, overlap_comm: the failure surfaces from the reduction's work.wait()
    message, frames = out["overlapped"]
    assert re.match(r"\[rank 0\] all_reduce failed: " + gone, message), message
    # From the reducer: a bucket whose collective ended (in error too) is landed during
    # backward (_land_finished), else at its end (after_backward), where the handle's wait()
    # raises; when rank 1's exit reached rank 0 before the bucket was issued, Gloo refuses the
    # call itself (comm's wrapper, `call`), still under the reducer's frames.
    assert frames[-1] in ("wait", "call"), frames
    assert {"_land_finished", "after_backward"} & set(frames[:-1]), frames
    assert out["handle"] == ("NamedWork", True)  # the Work's own methods still answer
    assert re.match(r"\[rank 0\] all_reduce failed: " + gone, out["waited"]), out
    assert re.match(r"\[rank 0\] all_reduce failed: " + gone, out["sync"]), out
    assert "Connection closed by peer" in out["sync"]  # Gloo's own words follow


def store_host_killed_worker(rank, world):
    from zerostream import comm

    comm.init_distributed(timeout=_TIMEOUT)
    comm.all_reduce(torch.ones(2))
    if rank == 0:  # rank 0's process hosts the TCPStore of MASTER_ADDR:MASTER_PORT
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    start = time.monotonic()
    message = _error(lambda: comm.all_reduce(torch.ones(2)))
    return message, time.monotonic() - start


@pytest.mark.timeout(120)
def test_a_dead_store_host_is_named_within_the_probe_timeout():
    rank0, rank1 = run_ranks(store_host_killed_worker, 2, timeout=100, expect_failure=True)
    assert rank0 == ("missing", "exit code -9")
    status, payload = rank1
    assert status == "ok", payload
    message, seconds = torch.load(io.BytesIO(payload))
    assert re.match(
        r"\[rank 1\] all_reduce failed: the process group's store at 127\.0\.0\.1:\d+ is "
        r"unreachable \(\w+\), so its host, rank 0, has likely exited; ",
        message,
    ), message
    assert seconds < 20  # the collectives' timeout (30 s) was not waited out


def uncaught_exception_worker(rank, world):
    from zerostream import comm

    comm.init_distributed(timeout=_TIMEOUT)
    comm.all_reduce(torch.ones(2))
    if rank == 1:
        # What Python does with an uncaught exception (and launchers that report it do the
        # same): the excepthook, then the exit handlers, then the process ends.
        try:
            raise ValueError("boom-rank-1")
        except ValueError:
            sys.excepthook(*sys.exc_info())
        atexit._run_exitfuncs()
        os._exit(1)
    time.sleep(0.5)
    return _error(lambda: comm.all_reduce(torch.ones(2)))


@pytest.mark.timeout(120)
def test_a_peer_that_exited_through_python_is_named_with_its_reason():
    message = _survivor_result(uncaught_exception_worker, "exit code 1")
    assert re.match(
        r"\[rank 0\] all_reduce failed: rank 1 \(pid \d+ on host [^)]+\) has exited "
        r"\(uncaught ValueError: boom-rank-1\); ",
        message,
    ), message


def _times_out_on_rank_1(rank, hold):
    """Rank 1 runs `hold` (it never returns) after the first collective; rank 0's second
    collective times out after 4 s. Rank 0 then kills rank 1 and returns its error and how
    long the collective took."""
    from zerostream import comm

    comm.init_distributed(timeout=datetime.timedelta(seconds=4))
    comm.all_reduce(torch.ones(2))
    if rank == 1:
        hold()
    time.sleep(0.5)
    start = time.monotonic()
    message = _error(lambda: comm.all_reduce(torch.ones(2)))
    elapsed = time.monotonic() - start
    import json

    import zerostream.comm.peers as peers

    record = json.loads(peers._default_store().get(peers._PEER_KEY.format(1)))
    os.kill(record["pid"], signal.SIGKILL)
    return message, elapsed


def stopped_peer_worker(rank, world):
    """Rank 1 stops itself (SIGSTOP): alive, holding its sockets, answering nothing; the
    error must name it as stopped."""
    return _times_out_on_rank_1(rank, lambda: os.kill(os.getpid(), signal.SIGSTOP))


@pytest.mark.timeout(120)
def test_a_stopped_rank_is_named_when_the_collective_times_out():
    message, elapsed = _survivor_result(stopped_peer_worker, "exit code -9")
    stopped = r"rank 1 \(pid \d+ on host [^)]+\) is stopped \(SIGSTOP, or held by a debugger\)"
    assert re.match(r"\[rank 0\] all_reduce failed: " + stopped, message), message
    assert elapsed < 30, elapsed  # the configured timeout (4 s), not a default one


def hung_peer_worker(rank, world):
    """Rank 1 stays alive but never reaches the next collective (a hang: it sleeps, as a rank
    blocked on a lock or a read would); the error must name it as alive and absent."""
    return _times_out_on_rank_1(rank, lambda: time.sleep(120))


@pytest.mark.timeout(120)
def test_a_hung_rank_is_named_when_the_collective_times_out():
    message, elapsed = _survivor_result(hung_peer_worker, "exit code -9")
    hung = (
        r"rank 1 \(pid (\d+) on host [^)]+\) is alive \(sleeping\) but has not reached this "
        r"collective: it is busy or hung elsewhere \(`py-spy dump --pid \1` shows where\)"
    )
    assert re.match(r"\[rank 0\] all_reduce failed: " + hung, message), message
    assert elapsed < 30, elapsed  # the configured timeout (4 s), not a default one

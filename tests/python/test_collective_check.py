"""Collective fingerprints (Note [Ranks that issue different collectives] in
zerostream/comm/collective_check.py): the comparison that names the first call where two ranks
differ, and the user's switch, ZEROSTREAM_CHECK_COLLECTIVES, on two Gloo ranks whose
collectives differ on purpose: the same bytes in other shapes (Gloo mixes them silently, as
NCCL would), another operation, a rank that never arrives. Each must raise on every rank,
naming the call, the shapes and the frame, within the check's timeout."""

import pytest
import torch

from multirank import run_ranks
from zerostream.comm.collective_check import first_difference


def _fp(op, tensors, frame="f.py:1 in g", group=(0, 1)):
    return {"op": op, "group": list(group), "tensors": tensors, "extra": [], "frame": frame}


def test_the_first_difference_is_named_with_both_calls_and_their_frames():
    same = [_fp("all_reduce", ["[4]:float32"]), _fp("broadcast", ["[2]:int64"])]
    assert first_difference({0: same, 1: list(same)}) is None
    # Frames may differ (two lines issuing the same call): not a difference.
    moved = [_fp("all_reduce", ["[4]:float32"], frame="h.py:9 in k"), same[1]]
    assert first_difference({0: same, 1: moved}) is None
    other = [same[0], _fp("broadcast", ["[3]:int64"], frame="x.py:7 in y")]
    said = first_difference({0: same, 1: other})
    assert "collective #1 on the world group" in said, said
    assert "[2]:int64" in said and "[3]:int64" in said and "x.py:7 in y" in said, said
    # A rank that stopped early: "nothing more".
    said = first_difference({0: same, 1: same[:1]})
    assert "rank 1 issued nothing more" in said, said
    # Point-to-point calls differ by design and are not compared; groups apart.
    p2p = [_fp("send", ["[4]:float32"])] + same
    assert first_difference({0: p2p, 1: same}) is None
    sub = [_fp("all_reduce", ["[1]:float32"], group=(0,))] + same
    assert first_difference({0: sub, 1: same}) is None


def _engine():
    import zerostream

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_optimization": {"stage": 1},
    }
    return zerostream.initialize(model=model, config=config)[0]


def mixing_worker(rank, world):
    """A step whose extra all-reduce has the same bytes in another shape on each rank."""
    from zerostream import comm
    from zerostream.comm.collective_check import CollectiveMismatchError

    engine = _engine()
    loss = engine(torch.ones(2, 4)).sum()
    engine.backward(loss)
    comm.all_reduce(torch.ones(4) if rank == 0 else torch.ones(2, 2))  # Gloo takes both
    try:
        engine.step()
    except CollectiveMismatchError as exc:
        return str(exc)
    return "no error"


def test_step_mode_names_a_call_whose_shapes_differ_on_every_rank():
    env = {"ZEROSTREAM_CHECK_COLLECTIVES": "step", "ZEROSTREAM_CHECK_TIMEOUT": "30"}
    said = run_ranks(mixing_worker, 2, timeout=90, env=env, check_collectives=False)
    for rank, message in enumerate(said):
        assert message.startswith(f"[rank {rank}]"), message
        assert "optimizer step 0" in message, message
        assert "all_reduce [4]:float32" in message and "all_reduce [2, 2]:float32" in message
        assert "test_collective_check.py" in message, message  # the frame that issued it


def each_worker(rank, world, case):
    import time

    from zerostream import comm
    from zerostream.comm.collective_check import CollectiveMismatchError

    comm.init_distributed()
    comm.all_reduce(torch.ones(3))  # agreed
    try:
        if case == "op":
            if rank == 0:
                comm.all_reduce(torch.ones(2))
            else:
                comm.broadcast(torch.ones(2), 0)
        elif case == "absent":
            if rank == 0:
                comm.all_reduce(torch.ones(2))
            else:
                time.sleep(6)  # never issues it (a hang on NCCL)
                return "slept"
    except CollectiveMismatchError as exc:
        return str(exc)
    return "no error"


def test_each_mode_refuses_another_operation_before_it_is_issued():
    env = {"ZEROSTREAM_CHECK_COLLECTIVES": "each", "ZEROSTREAM_CHECK_TIMEOUT": "30"}
    said = run_ranks(each_worker, 2, "op", timeout=90, env=env, check_collectives=False)
    for message in said:
        assert "collective #1 of group [0, 1]" in message, message
        assert "all_reduce [2]:float32" in message and "broadcast [2]:float32 src=0" in message


def test_each_mode_names_a_rank_that_does_not_arrive_and_its_last_call():
    env = {"ZEROSTREAM_CHECK_COLLECTIVES": "each", "ZEROSTREAM_CHECK_TIMEOUT": "2"}
    said = run_ranks(each_worker, 2, "absent", timeout=90, env=env, check_collectives=False)
    assert said[1] == "slept"
    assert "ranks [1] did not reach collective #1" in said[0], said[0]
    assert "rank 1 last issued #0: all_reduce [3]:float32" in said[0], said[0]


def test_a_bad_mode_is_refused_by_name():
    from zerostream.comm import collective_check

    with pytest.raises(ValueError, match="ZEROSTREAM_CHECK_COLLECTIVES: expected one of"):
        collective_check.Checker.__new__(collective_check.Checker).__init__("sometimes", None, 1)

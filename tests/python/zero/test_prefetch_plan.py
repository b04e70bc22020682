"""The stage-3 prefetch schedule through the binding (Note [Prefetch plan] in
zero/prefetch_schedule.h): plain lists in, one (fetch, prefetch, release, live_after_fetch,
live_after_release) tuple per trace event out; the rules themselves are tested in C++."""

import pytest

from zerostream import _C


def test_a_forward_backward_trace_gives_the_exact_schedule():
    # Modules 0 and 1 forward, then backward; parameter 0 (an embedding) is tied to module
    # 2's head, parameter 4 is persistent.
    trace = [(0, [0, 4]), (1, [1]), (2, [2, 0]), (1, [1]), (0, [0, 4])]
    events, peak = _C.plan_prefetch(
        trace,
        param_numel=[8, 4, 4, 0, 100],
        persistent=[False, False, False, False, True],
        prefetch_bucket_size=4,
        max_live_parameters=16,
        max_reuse_distance=5,
    )
    assert events == [
        ([0], [1], [], 12, 12),
        ([], [2], [1], 16, 12),
        ([], [1], [2], 16, 12),
        ([], [], [1], 12, 8),
        ([], [], [0], 8, 0),
    ]
    assert peak == 16


def test_a_bad_parameter_id_names_the_event_and_the_id():
    with pytest.raises(ValueError, match="trace event 1 lists parameter id 9"):
        _C.plan_prefetch([(0, [0]), (1, [9])], [1], [False], 0, 0, 0)

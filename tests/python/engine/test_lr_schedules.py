"""DeepSpeed LR schedules against closed-form formulas written out here, a LambdaLR
reference loop, state_dict resume, wrapper unwrapping and parameter validation."""

import math

import pytest
import torch

from zerostream import lr_schedules as L


def _optimizer(*lrs, cls=torch.optim.SGD, **kwargs):
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr} for lr in lrs]
    return cls(groups, lr=lrs[0], **kwargs)


def _lrs(opt):
    return [float(g["lr"]) for g in opt.param_groups]


def _walk(sched, opt, steps):
    """Steps `steps` times; returns [(iteration, lrs of every group)] after each step."""
    seen = []
    for _ in range(steps):
        sched.step()
        seen.append((sched.last_batch_iteration, _lrs(opt)))
    return seen


class _Wrapper:
    """Stands in for a ZeRO/fp16 optimizer wrapper: not an Optimizer, has .optimizer."""

    def __init__(self, inner):
        self.optimizer = inner


# --- WarmupLR ----------------------------------------------------------------------------------


def test_warmup_lr_log_matches_formula():
    opt = _optimizer(0.5)
    sched = L.WarmupLR(opt, warmup_min_lr=0.01, warmup_max_lr=0.1, warmup_num_steps=10)
    assert _lrs(opt) == [0.01]  # iteration -1 writes the minimum
    for it, lrs in _walk(sched, opt, 15):
        gamma = math.log(it + 1) / math.log(10) if it < 10 else 1.0
        assert lrs[0] == pytest.approx(0.01 + 0.09 * gamma, rel=1e-12), it
    assert sched.get_last_lr() == [pytest.approx(0.1)]


def test_warmup_lr_linear_and_per_group_lists():
    opt = _optimizer(0.5, 0.5)
    sched = L.WarmupLR(
        opt,
        warmup_min_lr=[0.0, 0.02],
        warmup_max_lr=(0.4, 0.2),
        warmup_num_steps=4,
        warmup_type="linear",
    )
    for it, lrs in _walk(sched, opt, 6):
        frac = min(it / 4, 1.0)
        assert lrs == pytest.approx([0.4 * frac, 0.02 + 0.18 * frac], rel=1e-12), it


def test_warmup_lr_default_max_is_each_groups_own_lr():
    # As DeepSpeed since its fix (test_warmup_lr_inherits_per_group_lr_when_max_unspecified).
    opt = _optimizer(0.3, 0.05)
    sched = L.WarmupLR(opt, warmup_num_steps=2, warmup_type="linear")
    assert sched.max_lrs == [0.3, 0.05]
    _walk(sched, opt, 3)
    assert _lrs(opt) == pytest.approx([0.3, 0.05])


def test_warmup_num_steps_one_is_clamped_to_two():
    opt = _optimizer(1.0)
    sched = L.WarmupLR(opt, warmup_min_lr=0.0, warmup_max_lr=1.0, warmup_num_steps=1)
    assert sched.warmup_num_steps == 2
    # gamma = ln(it + 1) / ln(2): 0 at iteration 0, 1 from iteration 1 on.
    assert [lrs[0] for _, lrs in _walk(sched, opt, 3)] == pytest.approx([0.0, 1.0, 1.0])


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "10", None])
def test_warmup_num_steps_must_be_positive_int(bad):
    with pytest.raises(ValueError, match="warmup_num_steps"):
        L.WarmupLR(_optimizer(0.1), warmup_num_steps=bad)


def test_warmup_lr_bad_values_name_the_parameter():
    with pytest.raises(ValueError, match=r"warmup_min_lr: expected 2 values"):
        L.WarmupLR(_optimizer(0.1, 0.1), warmup_min_lr=[0.0])
    with pytest.raises(ValueError, match="warmup_max_lr"):
        L.WarmupLR(_optimizer(0.1), warmup_max_lr="auto")


def test_unknown_warmup_type_falls_back_to_log(caplog):
    opt = _optimizer(0.1)
    with caplog.at_level("WARNING", logger="zerostream"):
        sched = L.WarmupLR(opt, warmup_max_lr=1.0, warmup_num_steps=8, warmup_type="cubic")
    assert "cubic" in caplog.text
    _walk(sched, opt, 4)
    assert _lrs(opt)[0] == pytest.approx(math.log(4) / math.log(8))


def test_warmup_lr_matches_lambda_lr_training_loop():
    """The same model trained with WarmupLR and with torch's LambdaLR expressing the same
    linear ramp must see identical lrs and identical parameters at every step."""
    torch.manual_seed(0)
    base, num = 0.2, 5
    models = [torch.nn.Linear(3, 1) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=base) for m in models]
    ours = L.WarmupLR(
        opts[0], warmup_min_lr=0.0, warmup_max_lr=base, warmup_num_steps=num, warmup_type="linear"
    )
    # LambdaLR's epoch e corresponds to WarmupLR's iteration e - 1.
    ref = torch.optim.lr_scheduler.LambdaLR(opts[1], lambda e: min(1.0, max(e - 1, 0) / num))
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    for step in range(9):
        for model, opt in zip(models, opts):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        assert _lrs(opts[0]) == pytest.approx(_lrs(opts[1]), rel=1e-12, abs=1e-15), step
        for p, q in zip(models[0].parameters(), models[1].parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=0)
        ours.step()
        ref.step()
    assert _lrs(opts[0]) == pytest.approx([base])


# --- WarmupDecayLR -----------------------------------------------------------------------------


def test_warmup_decay_lr_matches_formula():
    opt = _optimizer(0.5)
    sched = L.WarmupDecayLR(
        opt,
        total_num_steps=20,
        warmup_min_lr=0.0,
        warmup_max_lr=0.3,
        warmup_num_steps=5,
        warmup_type="linear",
    )
    for it, lrs in _walk(sched, opt, 25):
        gamma = it / 5 if it < 5 else max(0.0, (20 - it) / 15)
        assert lrs[0] == pytest.approx(0.3 * gamma, rel=1e-12, abs=1e-15), it
    assert _lrs(opt) == [0.0]


def test_warmup_decay_lr_default_max_and_short_total(caplog):
    opt = _optimizer(0.5)
    with caplog.at_level("WARNING", logger="zerostream"):
        sched = L.WarmupDecayLR(opt, total_num_steps=3, warmup_num_steps=4, warmup_type="linear")
    assert "less than warmup_num_steps" in caplog.text
    seen = [lrs[0] for _, lrs in _walk(sched, opt, 6)]
    # Default warmup_max_lr is 0.001; after warmup (it >= 4) gamma = max(0, (3-it)/max(1, -1)).
    assert seen == pytest.approx([0.0, 0.00025, 0.0005, 0.00075, 0.0, 0.0])


@pytest.mark.parametrize("bad", [None, 0, -3, 2.5, "100"])
def test_total_num_steps_required_and_positive(bad):
    for cls in (L.WarmupDecayLR, L.WarmupCosineLR):
        with pytest.raises(ValueError, match="total_num_steps"):
            cls(_optimizer(0.1), total_num_steps=bad)


def test_total_num_steps_accepts_integral_float_from_json():
    assert L.WarmupDecayLR(_optimizer(0.1), total_num_steps=1e4).total_num_steps == 10000


# --- WarmupCosineLR ----------------------------------------------------------------------------


@pytest.mark.parametrize("warmup_type", ["log", "linear"])
def test_warmup_cosine_lr_matches_formula(warmup_type):
    opt = _optimizer(0.2, 0.04)
    sched = L.WarmupCosineLR(
        opt,
        total_num_steps=20,
        warmup_min_ratio=0.1,
        warmup_num_steps=5,
        cos_min_ratio=0.01,
        warmup_type=warmup_type,
    )
    assert _lrs(opt) == [0.0, 0.0]  # iteration -1 writes 0, as DeepSpeed does
    for it, lrs in _walk(sched, opt, 26):
        if it < 5:
            frac = math.log(it + 1) / math.log(5) if warmup_type == "log" else it / 5
            ratio = 0.1 + 0.9 * frac
        else:
            progress = min(1.0, (it - 5 + 1) / 15)
            ratio = 0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * progress))
        assert lrs == pytest.approx([0.2 * ratio, 0.04 * ratio], rel=1e-12), it
    assert _lrs(opt) == pytest.approx([0.2 * 0.01, 0.04 * 0.01])  # held at the floor


# --- LRRangeTest -------------------------------------------------------------------------------


@pytest.mark.parametrize("staircase", [False, True])
def test_lr_range_test_matches_formula(staircase):
    opt = _optimizer(0.5, 0.5)
    sched = L.LRRangeTest(
        opt,
        lr_range_test_min_lr=[0.01, 0.002],
        lr_range_test_step_size=4,
        lr_range_test_step_rate=2.0,
        lr_range_test_staircase=staircase,
    )
    assert _lrs(opt) == [0.01, 0.002]
    for it, lrs in _walk(sched, opt, 10):
        frac = (it + 1) / 4
        if staircase:
            frac = math.floor(frac)
        assert lrs == pytest.approx([0.01 * (1 + 2 * frac), 0.002 * (1 + 2 * frac)]), it


@pytest.mark.parametrize("bad", [0, -1, 1.5, False])
def test_lr_range_test_step_size_validated(bad):
    with pytest.raises(ValueError, match="lr_range_test_step_size"):
        L.LRRangeTest(_optimizer(0.1), lr_range_test_step_size=bad)


# --- OneCycle ----------------------------------------------------------------------------------


def _triangle(it, first, second, stairs1=0, stairs2=0):
    """Reference cycle height for batch iteration `it` (0-based count of finished batches)."""
    pos = (it + 1) % (first + second)
    if pos <= first:
        return math.floor(pos * stairs1 / first) / stairs1 if stairs1 else pos / first
    up = first + second - pos
    return math.floor(up * stairs2 / second) / stairs2 if stairs2 else up / second


def test_one_cycle_lr_and_momentum_match_formula():
    opt = _optimizer(0.5, cls=torch.optim.Adam, betas=(0.95, 0.999))
    sched = L.OneCycle(
        opt,
        cycle_min_lr=0.001,
        cycle_max_lr=0.011,
        decay_lr_rate=0.5,
        cycle_first_step_size=4,
        cycle_second_step_size=6,
        decay_step_size=2,
        cycle_min_mom=0.8,
        cycle_max_mom=0.9,
        decay_mom_rate=0.01,
    )
    assert _lrs(opt) == [0.001]
    assert opt.param_groups[0]["betas"] == (0.8, 0.99)
    for _ in range(16):
        sched.step()
        it = sched.last_batch_iteration
        if it < 10:
            h = _triangle(it, 4, 6)
            lr, beta1 = 0.001 + 0.01 * h, 0.9 - 0.1 * h
        else:
            k = (it - 10 + 1) / 2
            lr, beta1 = 0.001 / (1 + 0.5 * k), 0.9 * (1 + 0.01 * k)
        assert _lrs(opt)[0] == pytest.approx(lr, rel=1e-12), it
        b1, b2 = opt.param_groups[0]["betas"]
        assert (b1, b2) == (pytest.approx(beta1, rel=1e-12), 0.99), it


def test_one_cycle_peak_and_staircase():
    opt = _optimizer(0.5, cls=torch.optim.AdamW)
    sched = L.OneCycle(
        opt,
        0.0,
        1.0,
        cycle_first_step_size=4,
        cycle_second_step_size=6,
        cycle_first_stair_count=2,
        cycle_second_stair_count=3,
    )
    seen = [lrs[0] for _, lrs in _walk(sched, opt, 10)]
    expect = [_triangle(it, 4, 6, 2, 3) for it in range(10)]
    assert seen == pytest.approx(expect)
    assert max(seen) == 1.0  # the peak is reached exactly, not one stair short


def test_one_cycle_no_decay_holds_min_lr():
    opt = _optimizer(0.5, cls=torch.optim.Adam)
    sched = L.OneCycle(opt, 0.01, 0.1, cycle_first_step_size=2)
    seen = [lrs[0] for _, lrs in _walk(sched, opt, 8)]
    assert seen[4:] == pytest.approx([0.01] * 4)
    assert opt.param_groups[0]["betas"] == (0.9, 0.99)


def test_one_cycle_without_betas_disables_momentum(caplog):
    opt = _optimizer(0.5, momentum=0.7)  # SGD: 'momentum', no 'betas'
    with caplog.at_level("WARNING", logger="zerostream"):
        sched = L.OneCycle(opt, 0.01, 0.1, cycle_first_step_size=2)
    assert "cycle_momentum is disabled" in caplog.text
    _walk(sched, opt, 3)
    assert not sched.cycle_momentum and "betas" not in opt.param_groups[0]
    assert opt.param_groups[0]["momentum"] == 0.7


def test_one_cycle_validation():
    with pytest.raises(ValueError, match="cycle_min_lr"):
        L.OneCycle(_optimizer(0.1), cycle_max_lr=0.1)
    with pytest.raises(ValueError, match="cycle_first_step_size"):
        L.OneCycle(_optimizer(0.1), 0.01, 0.1, cycle_first_step_size=0)
    with pytest.raises(ValueError, match="cycle_second_stair_count"):
        L.OneCycle(_optimizer(0.1), 0.01, 0.1, cycle_second_stair_count=-1)
    with pytest.raises(ValueError, match="cycle_second_step_size"):
        L.OneCycle(_optimizer(0.1), 0.01, 0.1, cycle_second_step_size=-1)


def test_one_cycle_without_a_decreasing_half():
    # cycle_second_step_size 0, as DeepSpeed allows: the lr rises over the first half only.
    opt = _optimizer(0.1)
    sched = L.OneCycle(opt, 0.001, 0.1, cycle_first_step_size=100, cycle_second_step_size=0)
    assert sched.step_ratio == 1.0 and sched.get_lr() == [pytest.approx(0.001)]
    for _ in range(3):
        sched.step()
    assert 0.001 < sched.get_lr()[0] < 0.1


# --- shared protocol ---------------------------------------------------------------------------

_FACTORIES = {
    "WarmupLR": lambda o: L.WarmupLR(o, 0.0, 0.1, warmup_num_steps=5),
    "WarmupDecayLR": lambda o: L.WarmupDecayLR(o, 12, warmup_num_steps=4),
    "WarmupCosineLR": lambda o: L.WarmupCosineLR(o, 12, warmup_num_steps=4),
    "OneCycle": lambda o: L.OneCycle(o, 0.01, 0.1, 0.3, 3, decay_step_size=2, decay_mom_rate=0.1),
    "LRRangeTest": lambda o: L.LRRangeTest(o, 0.01, 3, 0.5, True),
}


@pytest.mark.parametrize("name", sorted(_FACTORIES))
def test_state_dict_round_trip_resumes_identically(name):
    opt_a = _optimizer(0.1, 0.05, cls=torch.optim.Adam)
    a = _FACTORIES[name](opt_a)
    _walk(a, opt_a, 7)
    sd = a.state_dict()
    assert sd == {"last_batch_iteration": 6}
    opt_b = _optimizer(0.1, 0.05, cls=torch.optim.Adam)
    b = _FACTORIES[name](opt_b)
    b.load_state_dict(sd)
    assert b.get_last_lr() == pytest.approx(a.get_last_lr())
    for _ in range(8):
        a.step()
        b.step()
        assert _lrs(opt_b) == _lrs(opt_a)
        assert [g["betas"] for g in opt_b.param_groups] == [g["betas"] for g in opt_a.param_groups]


def test_load_state_dict_requires_iteration():
    with pytest.raises(ValueError, match="last_batch_iteration"):
        L.WarmupLR(_optimizer(0.1)).load_state_dict({})


def test_step_with_explicit_iteration_jumps():
    opt = _optimizer(0.1)
    sched = L.LRRangeTest(opt, 0.01, 4, 1.0)
    sched.step(11)
    assert _lrs(opt) == pytest.approx([0.01 * (1 + 12 / 4)])
    sched.step(batch_iteration=3)  # DeepSpeed's keyword name for this schedule
    assert _lrs(opt) == pytest.approx([0.01 * 2])


def test_resumed_construction_leaves_optimizer_until_step():
    opt = _optimizer(0.7)
    sched = L.WarmupLR(opt, 0.0, 1.0, 10, "linear", last_batch_iteration=4)
    assert _lrs(opt) == [0.7]
    with pytest.raises(RuntimeError, match="step"):
        sched.get_last_lr()
    sched.step()
    assert _lrs(opt) == pytest.approx([0.5])


def test_wrapper_is_unwrapped_and_non_optimizer_rejected():
    inner = _optimizer(0.1)
    sched = L.WarmupLR(_Wrapper(inner), 0.0, 1.0, 4, "linear")
    assert sched.optimizer is inner
    sched.step(2)
    assert _lrs(inner) == pytest.approx([0.5])
    with pytest.raises(TypeError, match="dict"):
        L.WarmupLR({"lr": 0.1})


def test_tensor_lr_is_updated_in_place():
    param = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([param], lr=torch.tensor(0.1))
    lr_tensor = opt.param_groups[0]["lr"]
    sched = L.WarmupLR(opt, 0.0, 0.4, 4, "linear")
    sched.step(2)
    assert opt.param_groups[0]["lr"] is lr_tensor
    assert float(lr_tensor) == pytest.approx(0.2)


# --- build_scheduler ---------------------------------------------------------------------------


def test_valid_lr_schedules_list():
    assert sorted(L.VALID_LR_SCHEDULES) == sorted(_FACTORIES)


def test_build_scheduler_by_name():
    inner = _optimizer(0.1)
    sched = L.build_scheduler(
        "WarmupDecayLR",
        _Wrapper(inner),
        {
            "total_num_steps": 10,
            "warmup_num_steps": 2,
            "warmup_max_lr": 0.2,
            "warmup_type": "linear",
        },
    )
    assert isinstance(sched, L.WarmupDecayLR) and sched.optimizer is inner
    torch_sched = L.build_scheduler("StepLR", _Wrapper(inner), {"step_size": 2, "gamma": 0.5})
    assert isinstance(torch_sched, torch.optim.lr_scheduler.StepLR)
    assert torch_sched.optimizer is inner


def test_build_scheduler_errors_name_the_problem():
    opt = _optimizer(0.1)
    with pytest.raises(ValueError, match=r"WarmupLR.*StepLR.*'Warmup'"):
        L.build_scheduler("Warmup", opt, {})
    with pytest.raises(ValueError, match="warmup_steps"):
        L.build_scheduler("WarmupLR", opt, {"warmup_steps": 10})
    with pytest.raises(ValueError, match="scheduler.params"):
        L.build_scheduler("WarmupLR", opt, None)
    with pytest.raises(ValueError, match="total_num_steps"):
        L.build_scheduler("WarmupCosineLR", opt, {})
    with pytest.raises(ValueError, match="step_size"):
        L.build_scheduler("StepLR", opt, {})
    with pytest.raises(ValueError, match="LRScheduler"):
        L.build_scheduler("LRScheduler", opt, {})

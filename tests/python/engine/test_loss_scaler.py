"""Loss scalers step by step against hand-written expected trajectories, the fp16-section
factory, the overflow check per dtype, and the clip coefficient against clip_grad_norm_."""

import copy

import pytest
import torch

from zerostream import precision as P
from zerostream.config import load

MIN_MSG = "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."


def _trajectory(scaler, overflows):
    """(scale, hysteresis) after each update_scale call."""
    out = []
    for overflow in overflows:
        scaler.update_scale(bool(overflow))
        out.append((scaler.cur_scale, scaler.cur_hysteresis))
    return out


# --- static ------------------------------------------------------------------------------------


def test_static_scaler_never_changes():
    scaler = P.LossScaler(128.0)
    assert not scaler.dynamic and scaler.loss_scale == 128.0
    scaler.update_scale(True)
    scaler.update_scale(False)
    assert scaler.cur_scale == 128.0
    assert float(scaler.scale_loss(torch.tensor(0.5))) == 64.0
    with pytest.raises(ValueError, match="loss_scale"):
        P.LossScaler(0.0)


# --- dynamic state machine ---------------------------------------------------------------------


def test_hysteresis_two_delays_the_first_halving_only():
    scaler = P.DynamicLossScaler(init_scale=16.0, scale_window=1000, min_scale=1.0, delayed_shift=2)
    # 1st overflow spends the hysteresis; later ones halve at once (the counter is not refilled).
    assert _trajectory(scaler, [1, 1, 1, 0, 1]) == [
        (16.0, 1),
        (8.0, 1),
        (4.0, 1),
        (4.0, 1),
        (2.0, 1),
    ]
    assert scaler.cur_iter == 5 and scaler.last_overflow_iter == 4


def test_window_growth_counts_from_start_and_from_last_overflow():
    scaler = P.DynamicLossScaler(init_scale=8.0, scale_window=3, min_scale=1.0, delayed_shift=1)
    seq = [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
    scales = [s for s, _ in _trajectory(scaler, seq)]
    # iter 3 and 6: stable interval 3, 6 -> double. iter 7 overflows -> halve.
    # Then iters 8..11 have stable 0,1,2,3 -> double again at iter 11.
    assert scales == [8, 8, 8, 16, 16, 16, 32, 16, 16, 16, 16, 32]


def test_growth_refills_hysteresis():
    scaler = P.DynamicLossScaler(init_scale=4.0, scale_window=2, min_scale=1.0, delayed_shift=2)
    assert _trajectory(scaler, [1, 0, 0, 0]) == [(4.0, 1), (4.0, 1), (4.0, 1), (8.0, 2)]


def test_consecutive_hysteresis_refills_on_every_clean_step():
    seq = [1, 0, 1, 0, 1, 1]
    plain = P.DynamicLossScaler(64.0, 1000, 1.0, 2, consecutive_hysteresis=False)
    refill = P.DynamicLossScaler(64.0, 1000, 1.0, 2, consecutive_hysteresis=True)
    assert _trajectory(plain, seq) == [
        (64.0, 1),
        (64.0, 1),
        (32.0, 1),
        (32.0, 1),
        (16.0, 1),
        (8.0, 1),
    ]
    assert _trajectory(refill, seq) == [
        (64.0, 1),
        (64.0, 2),
        (64.0, 1),
        (64.0, 2),
        (64.0, 1),
        (32.0, 1),
    ]


def test_min_scale_floor_then_exception():
    scaler = P.DynamicLossScaler(init_scale=6.0, scale_window=1000, min_scale=4.0, delayed_shift=1)
    scaler.update_scale(True)
    assert scaler.cur_scale == 4.0  # max(6 / 2, 4)
    with pytest.raises(Exception) as err:
        scaler.update_scale(True)
    assert str(err.value) == MIN_MSG
    assert scaler.cur_scale == 4.0


def test_min_scale_without_raising_stays_at_floor():
    scaler = P.DynamicLossScaler(2.0, 1000, 1.0, 1, raise_error_at_min_scale=False)
    assert [s for s, _ in _trajectory(scaler, [1, 1, 1])] == [1.0, 1.0, 1.0]


def test_dynamic_scaler_state_dict_resumes_identically():
    seq = [1, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    a = P.DynamicLossScaler(2.0**10, scale_window=3, min_scale=1.0, delayed_shift=2)
    _trajectory(a, seq[:6])
    b = P.DynamicLossScaler(2.0**10, scale_window=3, min_scale=1.0, delayed_shift=2)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert _trajectory(b, seq[6:]) == _trajectory(a, seq[6:])
    assert (b.cur_iter, b.last_overflow_iter) == (a.cur_iter, a.last_overflow_iter)
    with pytest.raises(ValueError, match="cur_hysteresis"):
        b.load_state_dict({"cur_scale": 1.0, "cur_iter": 0, "last_overflow_iter": -1})


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"init_scale": 0.0}, "init_scale"),
        ({"scale_window": 0}, "scale_window"),
        ({"min_scale": -1.0}, "min_scale"),
        ({"delayed_shift": 0}, "delayed_shift"),
        ({"scale_window": 1.5}, "scale_window"),
    ],
)
def test_dynamic_scaler_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        P.DynamicLossScaler(**kwargs)


# --- fp16 section factory ----------------------------------------------------------------------


def _fp16(**section):
    """The resolved fp16 section of a config, as the engine receives it."""
    return load(
        {"train_batch_size": 1, "fp16": {"enabled": True, **section}}, world_size=1, log=False
    ).fp16


def test_make_loss_scaler_dynamic_from_the_fp16_section():
    scaler = P.make_loss_scaler(
        _fp16(
            loss_scale=0,
            initial_scale_power=12,
            loss_scale_window=50,
            hysteresis=3,
            consecutive_hysteresis=True,
            min_loss_scale=2,
        )
    )
    assert isinstance(scaler, P.DynamicLossScaler)
    assert (
        scaler.loss_scale,
        scaler.scale_window,
        scaler.delayed_shift,
        scaler.min_scale,
        scaler.consecutive_hysteresis,
    ) == (4096.0, 50, 3, 2.0, True)


def test_at_stage_0_every_overflow_halves_the_scale_to_the_floor_as_deepspeeds_fp16_optimizer():
    """Note [The loss scale at stage 0]: DeepSpeed's FP16_Optimizer halves at each overflow
    whatever `hysteresis` says and stays at min_loss_scale without raising; ZeRO stages keep
    the hysteresis. The doubling rule is the same (DeepSpeed's test_dynamic_loss_scale.py)."""
    section = dict(loss_scale=0, initial_scale_power=4, loss_scale_window=2, hysteresis=2)
    stage0 = P.make_loss_scaler(_fp16(**section), stage=0)
    zero = P.make_loss_scaler(_fp16(**section), stage=1)
    flips = [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    assert [scale for scale, _ in _trajectory(stage0, flips)] == [8, 4, 2, 1, 1, 1, 1, 1, 2, 2, 4]
    assert [scale for scale, _ in _trajectory(zero, flips[:4])] == [16, 8, 4, 2]
    with pytest.raises(P.LossScaleAtMinimumError):
        _trajectory(zero, [1, 1])


def test_make_loss_scaler_takes_the_schema_defaults_for_absent_and_auto_keys():
    scaler = P.make_loss_scaler(_fp16(loss_scale_window="auto"))
    assert (
        scaler.loss_scale,
        scaler.scale_window,
        scaler.delayed_shift,
        scaler.min_scale,
        scaler.consecutive_hysteresis,
    ) == (65536.0, 1000, 2, 1.0, False)


def test_make_loss_scaler_static_and_disabled():
    static = P.make_loss_scaler(_fp16(loss_scale=256.0))
    assert type(static) is P.LossScaler and static.loss_scale == 256.0
    off = load({"train_batch_size": 1, "bf16": {"enabled": True}}, world_size=1, log=False).fp16
    for section in (None, off):  # bf16 / fp32
        noop = P.make_loss_scaler(section)
        assert type(noop) is P.LossScaler and noop.loss_scale == 1.0


@pytest.mark.parametrize(
    "key,value",
    [
        ("loss_scale", -1.0),
        ("loss_scale", True),
        ("loss_scale_window", 0),
        ("hysteresis", 0),
        ("min_loss_scale", 0),
        ("initial_scale_power", 2.5),
        ("initial_scale_power", 128),
    ],
)
def test_bad_fp16_values_fail_at_load_naming_the_key(key, value):
    with pytest.raises(ValueError, match=f"fp16.{key}: (expected|must be)"):
        _fp16(**{key: value})


# --- overflow check ----------------------------------------------------------------------------

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan"), None])
def test_has_inf_or_nan_per_dtype(dtype, bad):
    torch.manual_seed(1)
    tensors = [torch.randn(37, dtype=dtype), torch.randn(4, 5, dtype=dtype)]
    if bad is not None:
        tensors[1].view(-1)[13] = bad
    assert P.has_inf_or_nan(tensors) is (bad is not None)


@pytest.mark.parametrize("dtype", DTYPES)
def test_has_inf_or_nan_exact_on_largest_finite_values(dtype):
    big = torch.full((1000,), torch.finfo(dtype).max, dtype=dtype)
    assert P.has_inf_or_nan([big, -big]) is False  # a sum or norm would overflow here


def test_has_inf_or_nan_mixed_list_skips_none_empty_and_integers():
    assert P.has_inf_or_nan([]) is False
    assert P.has_inf_or_nan([None, torch.empty(0), torch.arange(5)]) is False
    mixed = [
        torch.ones(3, dtype=torch.float16),
        None,
        torch.ones(2, dtype=torch.bfloat16),
        torch.tensor([1.0, float("nan")]),
    ]
    assert P.has_inf_or_nan(mixed) is True


def test_has_inf_or_nan_syncs_once(monkeypatch):
    calls = []
    real_item = torch.Tensor.item

    def counting_item(self):
        calls.append(1)
        return real_item(self)

    monkeypatch.setattr(torch.Tensor, "item", counting_item)
    assert P.has_inf_or_nan([torch.ones(3) for _ in range(10)]) is False
    assert len(calls) == 1


# --- unscale and clip --------------------------------------------------------------------------


def _grads(model, x, y, scale):
    model.zero_grad()
    (torch.nn.functional.mse_loss(model(x), y) * scale).backward()
    return [p.grad for p in model.parameters()]


@pytest.mark.parametrize("clip", [0.05, 1e3, 0.0])
def test_unscale_and_clip_matches_clip_grad_norm(clip):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    ref = copy.deepcopy(model)
    x, y = torch.randn(16, 6), torch.randn(16, 2)
    scale = 2.0**12
    scaled = _grads(model, x, y, scale)
    ref_grads = _grads(ref, x, y, 1.0)
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
    total_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in scaled]))
    coef = P.unscale_and_clip_coef(total_norm, scale, clip)
    if clip == 1e3 or clip == 0.0:
        assert coef == 1.0
    else:
        assert coef > 1.0
    ours = [g / (coef * scale) for g in scaled]
    for got, want in zip(ours, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    # The in-place helper divides by the same product.
    assert P.unscale_and_clip_(scaled, float(total_norm), scale, clip) == pytest.approx(coef)
    for got, want in zip(scaled, ours):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


def test_unscale_and_clip_coef_formula_and_validation():
    assert P.unscale_and_clip_coef(400.0, 100.0, 2.0) == pytest.approx((4.0 + 1e-6) / 2.0)
    assert P.unscale_and_clip_coef(100.0, 100.0, 2.0) == 1.0
    with pytest.raises(ValueError, match="gradient_clipping"):
        P.unscale_and_clip_coef(1.0, 1.0, -1.0)
    with pytest.raises(ValueError, match="loss_scale"):
        P.unscale_and_clip_coef(1.0, 0.0, 1.0)


@pytest.mark.parametrize(
    "precision,dtype,dynamic,scale",
    [
        ({"bf16": {"enabled": True}}, torch.bfloat16, False, 1.0),
        ({"fp16": {"enabled": True, "loss_scale": 128}}, torch.float16, False, 128.0),
        ({"fp16": {"enabled": True, "initial_scale_power": 8}}, torch.float16, True, 256.0),
        ({}, torch.float32, False, 1.0),
    ],
)
def test_the_optimizer_names_its_dtype_and_loss_scale_as_deepspeed(
    one_rank_process_group, precision, dtype, dynamic, scale
):
    """engine.optimizer.low_precision_dtype and .loss_scale_config (cur_scale,
    dynamic_loss_scale), the names DeepSpeed's optimizer wrappers have (its
    test_ds_initialize reads them at stage 0 bf16)."""
    import zerostream

    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0}, **precision}
    cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3}}
    model = torch.nn.Linear(4, 4)
    engine = zerostream.initialize(model=model, config=cfg)[0]
    opt = engine.optimizer
    assert opt.low_precision_dtype == dtype
    assert opt.loss_scale_config.dynamic_loss_scale is dynamic
    assert opt.loss_scale_config.cur_scale == scale
    engine.destroy()

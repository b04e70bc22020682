"""16-bit masters and optimizer states in the CPU optimizers (Note [16-bit masters and
states] in csrc/optim/step_types.h): DeepSpeedCPUAdam's fp32_optimizer_states=False (states
of the param's dtype, the 16-bit param its own master) and zerostream's
fp32_master_weights=False (16-bit param its own master, fp32 states).

The reference is torch.optim itself, re-seeded each step from our 16-bit values widened to
fp32, its results rounded to the 16-bit dtype: ours must be within one 16-bit ulp of it
(an fp32 difference of a few ulp can cross a rounding boundary; see _reference.py) or, where
a result cancels to near zero, within the fp32 tolerance relative to the tensor's largest
value (FP32_RTOL), and almost all elements bit-equal."""

from __future__ import annotations

import pytest
import torch

from zerostream.ops.adagrad import DeepSpeedCPUAdagrad
from zerostream.ops.adam import DeepSpeedCPUAdam
from zerostream.ops.lion import DeepSpeedCPULion

from ._reference import FP32_RTOL, lion_reference_step, ulp16

SHAPES = [(33, 17), (17,), (300, 7), (1,)]


def _params(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in SHAPES]


def _grads(params, step):
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen) * 0.1).to(p.dtype)


def _assert_within_ulp(ours: torch.Tensor, ref32: torch.Tensor, what: str) -> None:
    ref = ref32.to(ours.dtype).float()
    diff = (ours.float() - ref).abs()
    allowed = torch.maximum(ulp16(ref, ours.dtype), FP32_RTOL * ref32.abs().max())
    assert bool((diff <= allowed).all()), f"{what}: more than one ulp off"
    exact = (diff == 0).float().mean().item()
    assert exact >= 0.98, f"{what}: only {exact:.1%} of the elements are bit-equal"


def _torch_reference(kind, p, grad, state, k):
    """One torch.optim step of `kind` on fp32 copies of p and its state; returns them."""
    p32 = torch.nn.Parameter(p.detach().float().clone())
    p32.grad = grad.float()
    if kind == "lion":
        m = state["exp_avg"].float().clone()
        lion_reference_step(p32.data, p32.grad, m, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.01)
        return p32.data, {"exp_avg": m}
    if kind == "adamw":
        ref = torch.optim.AdamW([p32], lr=1e-2, weight_decay=0.01, foreach=False)
        names = ("exp_avg", "exp_avg_sq")
    else:
        ref = torch.optim.Adagrad([p32], lr=1e-2, weight_decay=0.01, eps=1e-10, foreach=False)
        names = ("sum",)
    st = ref.state[p32]
    st["step"] = torch.tensor(float(k - 1))
    ours_names = ("exp_avg", "exp_avg_sq") if kind == "adamw" else ("exp_avg_sq",)
    for n, o in zip(names, ours_names):
        st[n] = state[o].float().clone()
    ref.step()
    return p32.data, {o: st[n] for n, o in zip(names, ours_names)}


def _make(kind, params, **kw):
    if kind == "adamw":
        return DeepSpeedCPUAdam(params, lr=1e-2, weight_decay=0.01, **kw)
    if kind == "adagrad":
        return DeepSpeedCPUAdagrad(params, lr=1e-2, weight_decay=0.01, **kw)
    return DeepSpeedCPULion(params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.01, **kw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["adamw", "adagrad", "lion"])
@pytest.mark.parametrize("half_states", [True, False])
def test_a_sixteen_bit_master_steps_like_torch_rounded(kind, dtype, half_states):
    params = _params(dtype)
    kw = {"fp32_optimizer_states": False} if half_states else {"fp32_master_weights": False}
    opt = _make(kind, params, **kw)
    for k in range(1, 4):
        _grads(params, k)
        before = [
            (
                p.detach().clone(),
                {
                    n: t.clone()
                    for n, t in opt.state[p].items()
                    if torch.is_tensor(t) and t.dim() > 0
                },
            )
            for p in params
        ]
        opt.step()
        for i, (p, (p0, st0)) in enumerate(zip(params, before)):
            state = opt.state[p]
            assert "fp32_param" not in state, "a 16-bit master keeps no fp32 copy"
            want = dtype if half_states else torch.float32
            for n in opt._state_names:
                assert state[n].dtype == want, f"{n} is {state[n].dtype}, not {want}"
            if k == 1:
                st0 = {n: torch.zeros(p.shape) for n in opt._state_names}
            ref_p, ref_state = _torch_reference(kind, p0, p.grad, st0, k)
            _assert_within_ulp(p.detach(), ref_p, f"{kind} step {k} param {i}")
            for n, t in ref_state.items():
                if half_states:
                    _assert_within_ulp(state[n], t, f"{kind} step {k} {n} {i}")
                else:
                    err = (state[n] - t).abs().max().item() / max(t.abs().max().item(), 1e-30)
                    assert err <= 1e-6, f"{kind} step {k} {n} {i}: relative error {err:.2e}"


def test_sixteen_bit_states_take_a_quarter_of_the_default_bytes():
    """bf16 params by default: fp32 master + two fp32 moments, 12 bytes an element; with
    fp32_optimizer_states=False two bf16 moments, 4 bytes, and the param is the master."""

    def state_bytes(opt, params):
        return sum(
            t.numel() * t.element_size()
            for p in params
            for t in opt.state[p].values()
            if torch.is_tensor(t) and t.dim() > 0
        )

    default_p, half_p = _params(torch.bfloat16), _params(torch.bfloat16)
    default, half = (
        DeepSpeedCPUAdam(default_p),
        DeepSpeedCPUAdam(half_p, fp32_optimizer_states=False),
    )
    for opt, params in ((default, default_p), (half, half_p)):
        _grads(params, 1)
        opt.step()
    n = sum(p.numel() for p in default_p)
    assert state_bytes(default, default_p) == 12 * n
    assert state_bytes(half, half_p) == 4 * n


def test_a_state_dict_round_trips_and_converts_to_the_state_dtype():
    params = _params(torch.bfloat16)
    opt = DeepSpeedCPUAdam(params, fp32_optimizer_states=False)
    _grads(params, 1)
    opt.step()
    saved = opt.state_dict()
    again = DeepSpeedCPUAdam(_params(torch.bfloat16), fp32_optimizer_states=False)
    again.load_state_dict(saved)
    for p, q in zip(params, again.param_groups[0]["params"]):
        for n in ("exp_avg", "exp_avg_sq"):
            assert again.state[q][n].dtype == torch.bfloat16
            assert torch.equal(again.state[q][n], opt.state[p][n])
    # fp32 moments saved by a default run load into bf16 states, rounded once.
    fp32_params = _params(torch.bfloat16)
    fp32_opt = DeepSpeedCPUAdam(fp32_params)
    _grads(fp32_params, 1)
    fp32_opt.step()
    half = DeepSpeedCPUAdam(_params(torch.bfloat16), fp32_optimizer_states=False)
    half.load_state_dict(fp32_opt.state_dict())
    for p, q in zip(fp32_params, half.param_groups[0]["params"]):
        m = half.state[q]["exp_avg"]
        assert m.dtype == torch.bfloat16
        assert torch.equal(m, fp32_opt.state[p]["exp_avg"].to(torch.bfloat16))


def test_a_param_copy_of_a_sixteen_bit_master_is_refused_by_name():
    from zerostream.ops.adam import cpu_adam_step

    p = torch.zeros(8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="its own 16-bit copy"):
        cpu_adam_step(p, p, p.clone(), p.clone(), lr=1e-3, step=1, param_copy=p.clone())
    with pytest.raises(ValueError, match="exp_avg"):
        cpu_adam_step(torch.zeros(8), p, p.clone(), p.clone(), lr=1e-3, step=1)

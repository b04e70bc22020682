"""The optimizers step a whole param group in one native call (``*_step_many``): each
tensor must get exactly the bits its own functional kernel call gives, whatever the mix of
sizes, dtypes and step counts, and a bad tensor anywhere in the group must be an error
naming it before anything is stepped."""

from __future__ import annotations

import pytest
import torch

from zerostream.ops.adagrad import DeepSpeedCPUAdagrad, cpu_adagrad_step
from zerostream.ops.adam import DeepSpeedCPUAdam, cpu_adam_step
from zerostream.ops.lion import DeepSpeedCPULion, cpu_lion_step

# Model-like: a big matrix, biases, norms, a bf16 weight (fp32 master + fused copy), a
# scalar, an odd-sized fp16 embedding.
_SPECS = [
    ((300, 257), torch.float32),
    ((257,), torch.float32),
    ((768,), torch.float32),
    ((64, 33), torch.bfloat16),
    ((1,), torch.float32),
    ((1001, 3), torch.float16),
]


def _params():
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter((torch.randn(s, generator=g) * 0.1).to(d)) for s, d in _SPECS]


def _grad(p, step, i):
    g = torch.Generator().manual_seed(100 * step + i)
    return (torch.randn(p.shape, generator=g) * 1e-2).to(p.dtype)


_KINDS = {
    "adamw": (
        lambda ps: DeepSpeedCPUAdam(ps, lr=1e-2, weight_decay=0.1),
        ("exp_avg", "exp_avg_sq"),
    ),
    "adam": (
        lambda ps: DeepSpeedCPUAdam(ps, lr=1e-2, weight_decay=0.1, adamw_mode=False),
        ("exp_avg", "exp_avg_sq"),
    ),
    "adagrad": (lambda ps: DeepSpeedCPUAdagrad(ps, lr=1e-2, weight_decay=0.1), ("exp_avg_sq",)),
    "lion": (
        lambda ps: DeepSpeedCPULion(ps, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1),
        ("exp_avg",),
    ),
}


def _reference_step(kind, p32, grad, states, step, copy, grad_scale):
    if kind in ("adam", "adamw"):
        cpu_adam_step(
            p32,
            grad,
            states[0],
            states[1],
            lr=1e-2,
            weight_decay=0.1,
            step=step,
            adamw_mode=kind == "adamw",
            param_copy=copy,
            grad_scale=grad_scale,
        )
    elif kind == "adagrad":
        cpu_adagrad_step(
            p32, grad, states[0], lr=1e-2, weight_decay=0.1, param_copy=copy, grad_scale=grad_scale
        )
    else:
        cpu_lion_step(
            p32,
            grad,
            states[0],
            lr=1e-3,
            betas=(0.9, 0.99),
            weight_decay=0.1,
            param_copy=copy,
            grad_scale=grad_scale,
        )


@pytest.mark.parametrize("kind", list(_KINDS))
def test_group_step_gives_each_tensor_its_own_calls_bits(kind):
    make, names = _KINDS[kind]
    params = _params()
    opt = make(params)
    # The per-tensor reference: fp32 masters and states of our own, stepped one call each.
    ref_p = [p.detach().float().clone() for p in params]
    ref_copy = [p.detach().clone() if p.dtype != torch.float32 else None for p in params]
    ref_s = [[torch.zeros(p.shape) for _ in names] for p in params]
    ref_steps = [0] * len(params)
    for step in range(1, 7):
        for i, p in enumerate(params):
            # Tensor 2 has no grad on odd steps, so the group mixes step counts.
            p.grad = None if (i == 2 and step % 2) else _grad(p, step, i)
        opt.step(grad_scale=0.5)
        for i, p in enumerate(params):
            if p.grad is None:
                continue
            ref_steps[i] += 1
            _reference_step(kind, ref_p[i], p.grad, ref_s[i], ref_steps[i], ref_copy[i], 0.5)
    for i, p in enumerate(params):
        state = opt.state[p]
        assert state["step"] == ref_steps[i]
        master = state.get("fp32_param", p.detach())
        assert torch.equal(master, ref_p[i]), f"param {i} ({p.dtype})"
        if ref_copy[i] is not None:
            assert torch.equal(p.detach(), ref_copy[i]), f"16-bit copy of param {i}"
        for name, ref in zip(names, ref_s[i]):
            assert torch.equal(state[name], ref), f"{name} of param {i}"


def test_a_step_count_stored_as_a_tensor_still_works():
    # torch's own optimizers keep "step" as a float tensor; a state dict converted from one
    # can carry that into ours.
    params = _params()[:2]
    opt = DeepSpeedCPUAdam(params, lr=1e-2)
    for i, p in enumerate(params):
        p.grad = _grad(p, 1, i)
    opt.step()
    ref = DeepSpeedCPUAdam([torch.nn.Parameter(p.detach().clone()) for p in params], lr=1e-2)
    ref.load_state_dict(opt.state_dict())
    for p in params:
        opt.state[p]["step"] = torch.tensor(1.0)
    for i, (p, q) in enumerate(zip(params, ref.param_groups[0]["params"])):
        p.grad = _grad(p, 2, i)
        q.grad = p.grad.clone()
    opt.step()
    ref.step()
    for p, q in zip(params, ref.param_groups[0]["params"]):
        assert torch.equal(p.detach(), q.detach())
        assert int(opt.state[p]["step"]) == 2


def test_a_bad_tensor_anywhere_names_it_and_steps_nothing():
    params = _params()
    opt = DeepSpeedCPUAdam(params, lr=1e-2)
    for i, p in enumerate(params):
        p.grad = _grad(p, 1, i)
    opt.step()
    before = [p.detach().clone() for p in params]
    exp_avgs = [opt.state[p]["exp_avg"].clone() for p in params]
    for i, p in enumerate(params):
        p.grad = _grad(p, 2, i)
    # A state that does not fit its param (a checkpoint of another model, say).
    opt.state[params[4]]["exp_avg_sq"] = torch.zeros(5)
    with pytest.raises(
        ValueError,
        match=r"param_groups\[0\]\['params'\]\[4\]: exp_avg_sq: "
        r"expected 1 elements",
    ):
        opt.step()
    for i, p in enumerate(params):
        assert torch.equal(p.detach(), before[i]), f"param {i} changed"
        assert torch.equal(opt.state[p]["exp_avg"], exp_avgs[i]), f"exp_avg {i} changed"
        assert opt.state[p]["step"] == 1

"""DeepSpeedCPUAdam / DeepSpeedCPUAdagrad / DeepSpeedCPULion as torch.optim.Optimizers:
param groups, parity with torch.optim, state_dict round trips, errors."""

from __future__ import annotations

import io

import pytest
import torch

from zerostream.ops.adagrad import CPUAdagrad, DeepSpeedCPUAdagrad
from zerostream.ops.adam import CPUAdam, DeepSpeedCPUAdam
from zerostream.ops.lion import CPULion, DeepSpeedCPULion

from ._reference import assert_close_fp32, lion_reference_step

SHAPES = [(33, 17), (17,), (4, 5, 6), (1,)]


def _params(seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in SHAPES]


def _groups(params, ours: bool, kind: str):
    first = {"params": params[:2]}
    second = {"params": params[2:], "lr": 3e-3, "weight_decay": 0.1}
    if kind == "lion":
        second["lr"] = 3e-4
    return [first, second]


def _make(kind, params, ours, **kw):
    groups = _groups(params, ours, kind)
    if kind == "adamw":
        return (
            DeepSpeedCPUAdam(groups, lr=1e-2, weight_decay=0.01, **kw)
            if ours
            else torch.optim.AdamW(groups, lr=1e-2, weight_decay=0.01)
        )
    if kind == "adam":
        return (
            DeepSpeedCPUAdam(groups, lr=1e-2, weight_decay=0.01, adamw_mode=False, **kw)
            if ours
            else torch.optim.Adam(groups, lr=1e-2, weight_decay=0.01)
        )
    if kind == "adagrad":
        return (
            DeepSpeedCPUAdagrad(groups, lr=1e-2, weight_decay=0.01, **kw)
            if ours
            else torch.optim.Adagrad(groups, lr=1e-2, weight_decay=0.01, eps=1e-10)
        )
    return DeepSpeedCPULion(groups, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.01, **kw)


def _set_grads(params, step, dtype=None):
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        g = torch.randn(p.shape, generator=gen)
        p.grad = g.to(dtype or p.dtype)


def _ref_lion_step(opt_groups_of_ours, ref_params, ref_state):
    for group, (gi_params) in zip(opt_groups_of_ours, ref_params):
        for p in gi_params:
            lion_reference_step(
                p.data,
                p.grad,
                ref_state[id(p)],
                lr=group["lr"],
                betas=group["betas"],
                weight_decay=group["weight_decay"],
            )


@pytest.mark.parametrize("kind", ["adamw", "adam", "adagrad", "lion"])
def test_matches_torch_with_param_groups(kind):
    ours_p, ref_p = _params(), _params()
    ours = _make(kind, ours_p, True)
    ref = None if kind == "lion" else _make(kind, ref_p, False)
    lion_state = {id(p): torch.zeros_like(p) for p in ref_p}
    for step in range(1, 31):
        _set_grads(ours_p, step)
        _set_grads(ref_p, step)
        ours.step()
        if ref is not None:
            ref.step()
        else:
            with torch.no_grad():
                _ref_lion_step(ours.param_groups, [ref_p[:2], ref_p[2:]], lion_state)
    for i, (a, b) in enumerate(zip(ours_p, ref_p)):
        assert_close_fp32(a.detach(), b.detach(), f"{kind} param {i}")
    assert ours.state[ours_p[0]]["step"] == 30


def _roundtrip(opt_factory, params, first, second):
    opt = opt_factory(params)
    for step in range(1, first + 1):
        _set_grads(params, step)
        opt.step()
    buf = io.BytesIO()
    torch.save({"params": [p.detach().clone() for p in params], "opt": opt.state_dict()}, buf)
    for step in range(first + 1, first + second + 1):
        _set_grads(params, step)
        opt.step()
    buf.seek(0)
    saved = torch.load(buf)
    resumed = [torch.nn.Parameter(t.clone()) for t in saved["params"]]
    opt2 = opt_factory(resumed)
    opt2.load_state_dict(saved["opt"])
    for step in range(first + 1, first + second + 1):
        _set_grads(resumed, step)
        opt2.step()
    return params, resumed, opt, opt2


@pytest.mark.parametrize("kind", ["adamw", "adagrad", "lion"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_state_dict_resumes_bit_identically(kind, dtype):
    params = _params(dtype=dtype)
    a, b, opt, opt2 = _roundtrip(lambda ps: _make(kind, ps, True), params, 5, 5)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    for x, y in zip(a, b):
        for key, v in opt.state[x].items():
            w = opt2.state[y][key]
            assert torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w, key
    assert opt2.param_groups[1]["lr"] == opt.param_groups[1]["lr"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_16bit_params_train_against_an_fp32_master(dtype):
    ours = _params(dtype=dtype)
    ref = _params()  # same values: the bf16 params are fp32 values rounded to bf16
    for p, r in zip(ours, ref):
        r.data.copy_(p.data.float())
    opt = DeepSpeedCPUAdam(ours, lr=1e-2)
    ropt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.0)
    for step in range(1, 21):
        _set_grads(ours, step, dtype)
        for p, r in zip(ours, ref):
            r.grad = p.grad.float()
        opt.step()
        ropt.step()
    for p, r in zip(ours, ref):
        master = opt.state[p]["fp32_param"]
        assert_close_fp32(master.view_as(r), r.detach(), "master")
        assert torch.equal(p.detach(), master.to(dtype).view_as(p))


def test_grad_scale_and_closure():
    a, b = _params(), _params()
    oa, ob = DeepSpeedCPUAdam(a, lr=1e-2), DeepSpeedCPUAdam(b, lr=1e-2)
    _set_grads(a, 1)
    _set_grads(b, 1)
    for p in b:
        p.grad.mul_(1024.0)
    loss = oa.step(closure=lambda: torch.tensor(1.5))
    ob.step(grad_scale=1 / 1024.0)
    assert loss.item() == 1.5
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_amsgrad_is_not_implemented():
    with pytest.raises(NotImplementedError, match="amsgrad"):
        DeepSpeedCPUAdam(_params(), amsgrad=True)
    with pytest.raises(NotImplementedError, match="amsgrad"):
        DeepSpeedCPUAdagrad(_params(), amsgrad=True)
    opt = DeepSpeedCPUAdam(_params())
    opt.param_groups[0]["amsgrad"] = True
    _set_grads(opt.param_groups[0]["params"], 1)
    with pytest.raises(NotImplementedError, match="amsgrad"):
        opt.step()


@pytest.mark.parametrize("cls", [DeepSpeedCPUAdam, DeepSpeedCPUAdagrad, DeepSpeedCPULion])
def test_bad_arguments_are_value_errors(cls):
    with pytest.raises(ValueError, match="learning rate"):
        cls(_params(), lr=-1.0)
    with pytest.raises(ValueError, match="weight_decay"):
        cls(_params(), weight_decay=-1.0)
    with pytest.raises(ValueError, match="threads"):
        cls(_params(), threads=-2)
    p = torch.nn.Parameter(torch.zeros(3, device="meta"))
    p.grad = torch.zeros(3, device="meta")
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[0\] is on meta"):
        cls([p]).step()


def test_bad_betas_are_value_errors():
    with pytest.raises(ValueError, match="beta"):
        DeepSpeedCPUAdam(_params(), betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="betas"):
        DeepSpeedCPULion(_params(), betas=0.9)


def test_zerostream_names_are_the_same_classes():
    assert CPUAdam is DeepSpeedCPUAdam
    assert CPUAdagrad is DeepSpeedCPUAdagrad
    assert CPULion is DeepSpeedCPULion
    assert issubclass(DeepSpeedCPUAdam, torch.optim.Optimizer)


def test_functional_calls_name_the_bad_argument():
    from zerostream.ops.adam import cpu_adam_step

    z = torch.zeros(8)
    with pytest.raises(ValueError, match="exp_avg_sq: expected 8 elements"):
        cpu_adam_step(z, z, z, torch.zeros(7), lr=1e-3, step=1)
    with pytest.raises(ValueError, match="param_copy: expected dtype"):
        cpu_adam_step(z, z, z, z.clone(), lr=1e-3, step=1, param_copy=torch.zeros(8))
    with pytest.raises(ValueError, match="grad: expected a contiguous"):
        cpu_adam_step(z, torch.zeros(16)[::2], z, z.clone(), lr=1e-3, step=1)
    with pytest.raises(ValueError, match="step must be >= 1"):
        cpu_adam_step(z, z, z, z.clone(), lr=1e-3, step=0)


def test_fp32_optimizer_states_false_keeps_fp32_states_for_fp32_params():
    """DeepSpeed's state dtype is the param's when fp32_optimizer_states=False: for fp32
    params that is fp32, so nothing changes (16-bit params: test_half_states.py)."""
    params = _params()
    opt = DeepSpeedCPUAdam(params, fp32_optimizer_states=False)
    _set_grads(params, 0)
    opt.step()
    for p in params:
        assert opt.state[p]["exp_avg"].dtype == torch.float32
        assert "fp32_param" not in opt.state[p]


def test_adagrad_steps_sparse_embedding_gradients_as_torch_adagrad():
    """An embedding with sparse=True: DeepSpeedCPUAdagrad steps the rows the gradient
    touches (as DeepSpeed's does) and equals torch.optim.Adagrad's sparse update; untouched
    rows and their state stay; Adam still refuses sparse gradients, naming the param."""
    torch.manual_seed(0)
    ours, ref = torch.nn.Embedding(50, 8, sparse=True), torch.nn.Embedding(50, 8, sparse=True)
    ref.load_state_dict(ours.state_dict())
    dense = torch.nn.Linear(8, 1)  # a dense param beside it, in the same group
    dense_ref = torch.nn.Linear(8, 1)
    dense_ref.load_state_dict(dense.state_dict())
    opt = DeepSpeedCPUAdagrad([ours.weight, dense.weight, dense.bias], lr=0.1)
    want = torch.optim.Adagrad([ref.weight, dense_ref.weight, dense_ref.bias], lr=0.1, eps=1e-10)
    for _ in range(5):
        ids = torch.randint(0, 25, (4, 3))  # rows 25.. never touched
        for emb, lin, o in ((ours, dense, opt), (ref, dense_ref, want)):
            o.zero_grad()
            lin(emb(ids)).square().sum().backward()
            assert emb.weight.grad.is_sparse
            o.step()
    torch.testing.assert_close(ours.weight, ref.weight, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(dense.weight, dense_ref.weight, rtol=1e-6, atol=1e-7)
    assert torch.equal(opt.state[ours.weight]["exp_avg_sq"][25:], torch.zeros(25, 8))
    assert opt.state[ours.weight]["step"] == 5
    emb = torch.nn.Embedding(5, 2, sparse=True)
    emb(torch.tensor([1])).sum().backward()
    with pytest.raises(ValueError, match=r"params'\]\[0\]: sparse gradients are not supported"):
        DeepSpeedCPUAdam([emb.weight]).step()

"""100 steps of the fused CPU kernels against torch.optim (Adam, AdamW, Adagrad) and a
plain-torch Lion, for every grad dtype x 16-bit copy combination, on slices of one flat
buffer whose sizes hit every SIMD tail (see _reference.py for the tolerances)."""

from __future__ import annotations

import pytest
import torch

from zerostream.ops.adagrad import cpu_adagrad_step
from zerostream.ops.adam import cpu_adam_step
from zerostream.ops.lion import cpu_lion_step

from ._reference import (
    adam_no_bias_correction_step,
    assert_close_fp32,
    assert_copy_ok,
    lion_reference_step,
)

STEPS = 100
# Slices of one flat buffer, starting at odd offsets (unaligned), sizes covering every tail of
# 8- and 16-wide vectors, a cache-line peel, and a multi-vector body.
SIZES = (1, 7, 8, 15, 16, 17, 31, 33, 63, 65, 130, 1031)
GRAD_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
COPY_DTYPES = (None, torch.bfloat16, torch.float16)
LR = 1e-2


def _slices(total_pad: int = 3):
    out, off = [], total_pad
    for n in SIZES:
        out.append((off, n))
        off += n + 5
    return out, off


class Flat:
    """ours: fp32 params/states and a 16-bit copy in flat buffers, stepped slice by slice."""

    def __init__(self, states: int, copy_dtype, seed: int):
        self.slices, total = _slices()
        g = torch.Generator().manual_seed(seed)
        self.p = torch.randn(total, generator=g)
        self.s = [torch.zeros(total) for _ in range(states)]
        self.copy = None if copy_dtype is None else torch.zeros(total, dtype=copy_dtype)

    def views(self, off, n):
        sl = slice(off, off + n)
        return self.p[sl], [s[sl] for s in self.s], None if self.copy is None else self.copy[sl]


def _grads(total, dtype, gen):
    return (torch.randn(total, generator=gen) * 0.1).to(dtype)


def _run(
    kind,
    grad_dtype,
    copy_dtype,
    *,
    adamw_mode=True,
    bias_correction=True,
    weight_decay=0.01,
    grad_scale=1.0,
):
    states = {"adam": 2, "adagrad": 1, "lion": 1}[kind]
    flat = Flat(states, copy_dtype, seed=1)
    refs = []
    for off, n in flat.slices:
        rp = flat.p[off : off + n].clone().requires_grad_(True)
        if kind == "adam" and bias_correction:
            cls = torch.optim.AdamW if adamw_mode else torch.optim.Adam
            opt = cls([rp], lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay)
        elif kind == "adagrad":
            opt = torch.optim.Adagrad([rp], lr=LR, eps=1e-10, weight_decay=weight_decay)
        else:
            opt = None
        refs.append((rp, opt, [torch.zeros(n) for _ in range(states)]))
    gen = torch.Generator().manual_seed(2)
    for step in range(1, STEPS + 1):
        # The grads a loss scaled by 1/grad_scale would give (exact: powers of two).
        grad = (_grads(flat.p.numel(), torch.float32, gen) / grad_scale).to(grad_dtype)
        for (off, n), (rp, opt, rs) in zip(flat.slices, refs):
            p, s, c = flat.views(off, n)
            g = grad[off : off + n]
            if kind == "adam":
                cpu_adam_step(
                    p,
                    g,
                    s[0],
                    s[1],
                    lr=LR,
                    betas=(0.9, 0.999),
                    eps=1e-8,
                    weight_decay=weight_decay,
                    step=step,
                    adamw_mode=adamw_mode,
                    bias_correction=bias_correction,
                    grad_scale=grad_scale,
                    param_copy=c,
                )
            elif kind == "adagrad":
                cpu_adagrad_step(
                    p,
                    g,
                    s[0],
                    lr=LR,
                    eps=1e-10,
                    weight_decay=weight_decay,
                    grad_scale=grad_scale,
                    param_copy=c,
                )
            else:
                cpu_lion_step(
                    p,
                    g,
                    s[0],
                    lr=LR,
                    betas=(0.9, 0.99),
                    weight_decay=weight_decay,
                    grad_scale=grad_scale,
                    param_copy=c,
                )
            ref_grad = g.float() * grad_scale
            with torch.no_grad():
                if opt is not None:
                    rp.grad = ref_grad
                    opt.step()
                elif kind == "adam":
                    adam_no_bias_correction_step(
                        rp,
                        ref_grad,
                        rs[0],
                        rs[1],
                        lr=LR,
                        betas=(0.9, 0.999),
                        eps=1e-8,
                        weight_decay=weight_decay,
                    )
                else:
                    lion_reference_step(
                        rp, ref_grad, rs[0], lr=LR, betas=(0.9, 0.99), weight_decay=weight_decay
                    )
    return flat, refs


def _ref_states(kind, rp, opt, rs):
    if opt is None:
        return rs
    st = opt.state[rp]
    return [st["exp_avg"], st["exp_avg_sq"]] if kind == "adam" else [st["sum"]]


def _check(kind, flat, refs):
    for (off, n), (rp, opt, rs) in zip(flat.slices, refs):
        p, s, c = flat.views(off, n)
        what = f"{kind} size {n} at offset {off}"
        assert_close_fp32(p, rp.detach(), what + " param")
        for i, (ours, ref) in enumerate(zip(s, _ref_states(kind, rp, opt, rs))):
            assert_close_fp32(ours, ref, f"{what} state {i}")
        if c is not None:
            assert_copy_ok(c, p, rp.detach(), what + " copy")
    pad = torch.ones(flat.p.numel(), dtype=torch.bool)
    for off, n in flat.slices:
        pad[off : off + n] = False
    assert bool((flat.s[0][pad] == 0).all()), f"{kind}: wrote outside its slices"


@pytest.mark.parametrize("copy_dtype", COPY_DTYPES, ids=["nocopy", "copy_bf16", "copy_fp16"])
@pytest.mark.parametrize("grad_dtype", GRAD_DTYPES, ids=["g_fp32", "g_bf16", "g_fp16"])
@pytest.mark.parametrize("kind", ["adam", "adagrad", "lion"])
def test_matches_torch_every_dtype(kind, grad_dtype, copy_dtype):
    flat, refs = _run(kind, grad_dtype, copy_dtype)
    _check(kind, flat, refs)


@pytest.mark.parametrize(
    "adamw_mode,bias_correction",
    [(False, True), (True, False)],
    ids=["adam_l2", "adamw_no_bias_correction"],
)
def test_adam_modes(adamw_mode, bias_correction):
    flat, refs = _run(
        "adam",
        torch.float32,
        torch.bfloat16,
        adamw_mode=adamw_mode,
        bias_correction=bias_correction,
    )
    _check("adam", flat, refs)


@pytest.mark.parametrize("kind", ["adam", "adagrad", "lion"])
def test_grad_scale_is_folded_in(kind):
    # Grads of a loss scaled by 2^10 stepped with grad_scale 2^-10 equal the unscaled step.
    flat, refs = _run(kind, torch.bfloat16, None, grad_scale=2.0**-10)
    _check(kind, flat, refs)

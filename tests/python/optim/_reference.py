"""Plain-torch references and comparison helpers for the CPU optimizer tests.

Tolerances (why):
- fp32 outputs (params and states): max |ours - torch| / max |torch| <= 1e-6 after 100
  steps. Both sides compute in fp32; they differ only in where fp32 rounding happens (we fuse
  multiply-adds, torch rounds each op), which leaves errors of a few ulp (~1e-7 relative).
- 16-bit param copies: bit-identical to ``ours_fp32.to(dtype)`` (both round to nearest even),
  and within one 16-bit ulp of ``torch_fp32.to(dtype)``: a ~1e-7 difference in the fp32
  value can move it across a 16-bit rounding boundary (bf16 ulp is 2^-8 relative, fp16 2^-11).
- 16-bit grads: converting them to fp32 is exact, so the reference receives ``grad.float()``
  and the fp32 tolerance above still applies.
"""

from __future__ import annotations

import torch

FP32_RTOL = 1e-6


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    ours, ref = ours.double(), ref.double()
    scale = ref.abs().max().item()
    return (ours - ref).abs().max().item() / (scale if scale > 0 else 1.0)


def assert_close_fp32(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    err = rel_err(ours, ref)
    assert err <= FP32_RTOL, f"{what}: relative error {err:.3e} > {FP32_RTOL:g}"


def ulp16(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The 16-bit ulp at each |x| (x already rounded to dtype), as fp32."""
    mant = 7 if dtype == torch.bfloat16 else 10
    min_exp = -126 if dtype == torch.bfloat16 else -14
    e = torch.floor(torch.log2(x.float().abs().clamp_min(2.0**min_exp)))
    return torch.exp2(e - mant)


def assert_copy_ok(
    copy: torch.Tensor, ours32: torch.Tensor, ref32: torch.Tensor, what: str
) -> None:
    assert torch.equal(copy, ours32.to(copy.dtype)), f"{what}: copy != round(our fp32 params)"
    ref16 = ref32.to(copy.dtype).float()
    diff = (copy.float() - ref16).abs()
    assert bool((diff <= ulp16(ref16, copy.dtype)).all()), (
        f"{what}: 16-bit copy more than one ulp from torch's rounded params"
    )


def lion_reference_step(p, grad, exp_avg, *, lr, betas, weight_decay):
    """Lion in plain torch, each product and sum rounded separately (as csrc/optim rounds)."""
    beta1, beta2 = betas
    p.mul_(1 - lr * weight_decay)
    update = exp_avg * beta1 + grad * (1 - beta1)
    p.add_(torch.sign(update) * -lr)
    exp_avg.mul_(beta2).add_(grad * (1 - beta2))


def adam_no_bias_correction_step(p, grad, m, v, *, lr, betas, eps, weight_decay):
    """AdamW without bias correction (DeepSpeed's bias_correction=False), plain torch."""
    beta1, beta2 = betas
    p.mul_(1 - lr * weight_decay)
    m.lerp_(grad, 1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    p.addcdiv_(m, v.sqrt().add_(eps), value=-lr)

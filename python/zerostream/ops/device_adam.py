"""Adam/AdamW over tensors on the compute device: the update of the optimizer sub-groups that
`offload_optimizer.ratio` keeps on the device (Note [The device tier] in
offload/device_tier.py).

It is the per-element rule of the fused CPU kernel (csrc/optim/kernels/update_rules.h,
torch.optim.Adam/AdamW with amsgrad and maximize off), written with torch ops so that it runs
wherever the tensors are, queued on the current stream: the same coefficients (bias
corrections in double, as torch.optim computes them in Python floats), the same order of
operations, fp32 arithmetic whatever the dtypes held (a bf16 master or bf16 moments are
widened, updated and rounded back). It agrees with the CPU kernel to fp32 rounding (the kernel
fuses multiply-adds), not bit for bit.
"""

from __future__ import annotations

import math
from typing import Tuple

import torch

# Elements updated at a time: the fp32 temporaries (the scaled gradient, the denominator, and
# the widened copies of 16-bit tensors) stay within a few of these, whatever the sub-group.
CHUNK = 1 << 24


def device_adam_step(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    lr: float,
    betas: Tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    step: int,
    bias_correction: bool = True,
    adamw_mode: bool = True,
    grad_scale: float = 1.0,
) -> None:
    """One Adam (adamw_mode=False: L2) / AdamW step in place; `grad` (fp32 or 16-bit, on
    param's device) is multiplied by grad_scale first. step is 1-based."""
    if step < 1:
        raise ValueError(f"adam: step must be >= 1 (1-based); got {step}")
    beta1, beta2 = float(betas[0]), float(betas[1])
    bc1 = bc2 = 1.0
    if bias_correction:
        bc1 = 1.0 - beta1**step
        bc2 = 1.0 - beta2**step
    inv_bc2_sqrt = 1.0 / math.sqrt(bc2)
    n = param.numel()
    for a in range(0, n, CHUNK):
        b = min(a + CHUNK, n)
        # fp32 tensors are updated in place; 16-bit ones through an fp32 copy of the chunk.
        p, m, v = (t[a:b].float() for t in (param, exp_avg, exp_avg_sq))
        g = grad[a:b].float().mul(grad_scale)
        if weight_decay != 0.0 and not adamw_mode:
            g.add_(p, alpha=weight_decay)
        if weight_decay != 0.0 and adamw_mode:
            p.mul_(1.0 - lr * weight_decay)
        m.add_(g.sub(m), alpha=1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        denom = v.sqrt().mul_(inv_bc2_sqrt).add_(eps)
        p.addcdiv_(m, denom, value=-lr / bc1)
        for t, new in ((param, p), (exp_avg, m), (exp_avg_sq, v)):
            if t.dtype != torch.float32:
                t[a:b].copy_(new)

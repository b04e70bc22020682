"""`deepspeed.ops.adam.FusedAdam`: DeepSpeed's constructor over torch's Adam.

DeepSpeed's FusedAdam is a multi-tensor Adam kernel; torch's Adam does the same work in one
fused (CUDA) or multi-tensor (foreach) pass, so this class only translates the arguments. It
is a torch.optim.Adam, which ZeRO accepts as a tested optimizer.
"""

from __future__ import annotations

import torch


class FusedAdam(torch.optim.Adam):
    def __init__(
        self,
        params,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        adam_w_mode: bool = True,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        set_grad_none: bool = True,
        **torch_options,
    ):
        """DeepSpeed's arguments; `torch_options` are torch.optim.Adam's own keywords (an
        engine rebuilding the optimizer from its `defaults` passes them back)."""
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant (amsgrad=True)")
        if not bias_correction:
            raise NotImplementedError(
                "FusedAdam(bias_correction=False) is not supported by zerostream: torch's Adam "
                "always corrects the moments' bias"
            )
        params = list(params)
        on_cuda = all(
            t.is_cuda
            for item in params
            for t in (item["params"] if isinstance(item, dict) else [item])
        )
        adam_w_mode = torch_options.pop("decoupled_weight_decay", adam_w_mode)
        fused = torch_options.pop("fused", True if on_cuda and params else None)
        super().__init__(
            params,
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            decoupled_weight_decay=adam_w_mode,
            fused=fused,
            **torch_options,
        )
        self.adam_w_mode = adam_w_mode
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none: bool = None) -> None:
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

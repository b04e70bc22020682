"""FusedAdam: DeepSpeed's constructor (`deepspeed.ops.adam.FusedAdam`) over torch's Adam.

DeepSpeed's FusedAdam is one kernel pass over parameters, gradients and moments; torch's fused
Adam is that pass, on CUDA and on the CPU. This class translates DeepSpeed's arguments
(`adam_w_mode` for decoupled weight decay, `set_grad_none`) and is what a config's Adam/AdamW
builds without offload unless `torch_adam: true` (zerostream/optim_factory.py), so the
engine's inner optimizer is the class DeepSpeed's users and tests look for. It is a
torch.optim.Adam: its state and state_dict are torch's.
"""

from __future__ import annotations

from typing import Optional

import torch

# Where torch's fused Adam runs; elsewhere its multi-tensor (foreach) one does.
_FUSED_DEVICES = ("cuda", "cpu")


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
        tensors = [
            t for item in params for t in (item["params"] if isinstance(item, dict) else [item])
        ]
        fusable = bool(tensors) and all(
            t.device.type in _FUSED_DEVICES and t.is_floating_point() for t in tensors
        )
        adam_w_mode = torch_options.pop("decoupled_weight_decay", adam_w_mode)
        fused = torch_options.pop("fused", True if fusable else None)
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

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

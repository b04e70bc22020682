"""`deepspeed.runtime.zero.linear`: DeepSpeed's linear layer for ZeRO stage 3, which keeps
the parameter (not a gathered copy of it) for the backward pass, and the autocast decorators
it runs under.

zerostream's stage 3 gathers a module's parameters for its backward itself, so nothing here
is needed for memory; these are for code that builds its layers from these classes. The
math is torch's linear: y = x W^T + b, with the gradients of F.linear.
"""

from __future__ import annotations

import functools

import torch
from torch.nn import Module, Parameter, init

from zerostream.accelerator import get_accelerator


def noop_decorator(fn=None, **_kwargs):
    return fn if fn is not None else (lambda f: f)


def _device_type() -> str:
    return torch.device(get_accelerator().device_name()).type


autocast_custom_fwd = functools.partial(torch.amp.custom_fwd, device_type=_device_type())
autocast_custom_bwd = functools.partial(torch.amp.custom_bwd, device_type=_device_type())


class LinearFunctionForZeroStage3(torch.autograd.Function):
    """y = x W^T + b in the caller's autocast state, as under autocast_custom_fwd. In the
    functorch form (setup_context, so torch.func's grad and vmap can run it) forward is
    called below the autocast dispatch key, so `apply` reads that state first and hands it
    to forward."""

    generate_vmap_rule = True

    @classmethod
    def apply(cls, input, weight, bias=None, *state):
        if not state:  # the caller's call; functorch calls again with the state given
            device = _device_type()
            state = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        return super().apply(input, weight, bias, *state)

    @staticmethod
    def forward(input, weight, bias, autocast_on, autocast_dtype):
        if autocast_on:  # autocast's rule for a linear: computed in the lower precision
            input, weight = input.to(autocast_dtype), weight.to(autocast_dtype)
            bias = bias.to(autocast_dtype) if bias is not None else None
        out = input.matmul(weight.t())
        return out + bias if bias is not None else out

    @staticmethod
    def setup_context(ctx, inputs, output):
        input, weight, bias, autocast_on, autocast_dtype = inputs
        ctx._fwd_used_autocast, ctx._dtype = autocast_on, autocast_dtype  # for custom_bwd
        ctx.save_for_backward(input, weight, bias)

    @staticmethod
    @autocast_custom_bwd
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output.matmul(weight.to(grad_output.dtype))
        if ctx.needs_input_grad[1]:
            flat_out = grad_output.reshape(-1, grad_output.shape[-1])
            flat_in = input.reshape(-1, input.shape[-1]).to(flat_out.dtype)
            grad_weight = flat_out.t().matmul(flat_in)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_output.reshape(-1, grad_output.shape[-1]).sum(0)
        return grad_input, grad_weight, grad_bias, None, None


def zero3_linear_wrap(input, weight, bias=None):
    return LinearFunctionForZeroStage3.apply(input, weight, bias)


class LinearModuleForZeroStage3(Module):
    """torch.nn.Linear's parameters and initialization, computed by
    LinearFunctionForZeroStage3."""

    __constants__ = ["in_features", "out_features"]

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(torch.empty(out_features, in_features))
        self.bias = Parameter(torch.empty(out_features)) if bias else None
        if bias is False:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():  # torch.nn.Linear's initialization
            init.kaiming_uniform_(self.weight, a=5**0.5)
            if self.bias is not None:
                bound = 1 / self.in_features**0.5 if self.in_features > 0 else 0
                init.uniform_(self.bias, -bound, bound)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return LinearFunctionForZeroStage3.apply(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}"


__all__ = [
    "LinearFunctionForZeroStage3",
    "LinearModuleForZeroStage3",
    "autocast_custom_bwd",
    "autocast_custom_fwd",
    "zero3_linear_wrap",
]

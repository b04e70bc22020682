"""Counting a forward's floating-point operations and MACs on torch's FlopCounterMode.

Note [Which operations count]
  DeepSpeed's profiler wraps torch.nn.functional and a few tensor methods and counts with
  its own formula per function. Here every operation is seen where torch dispatches it (the
  aten op), through `torch.utils.flop_counter.FlopCounterMode`:
  - the operations torch's own registry knows (matrix products, convolutions, attention)
    are counted by torch's formulas, and as multiply-accumulates: each counts 2 flops per
    MAC, so MACs = flops / 2 (DeepSpeed's F.linear, conv, matmul and attention formulas
    give the same numbers);
  - the operations DeepSpeed counts besides those, with its per-element rules and no MACs:
    the bias of a convolution (one flop per output element), the activations relu, relu6,
    elu, leaky_relu, silu, gelu and prelu (one per input element), batch/layer/group/
    instance norm (4 per element, 5 with an affine transform; batch norm in eval 1 or 2),
    pooling (one per input element), upsampling (one per output element) and softmax (one
    per input element).
  What DeepSpeed does not count is not counted either (tanh, sigmoid, log_softmax and the
  losses, dropout, embedding). Differences that come from counting at the dispatcher, not
  the Python function, are listed in docs/compat.md (flops_profiler).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

import torch

if TYPE_CHECKING:
    from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten


class OpTally:
    """Running totals of one profile: `flops` and `macs` since it began. Module hooks read
    it before and after each forward (flops_profiler.py); the counter's formulas add to it."""

    def __init__(self) -> None:
        self.flops = 0
        self.macs = 0

    def add(self, mac_flops: int, other_flops: int) -> None:
        self.flops += mac_flops + other_flops
        self.macs += mac_flops // 2


def _input_elements(inp, *args, **kwargs) -> int:
    return inp.numel()


def _output_elements(*args, out_val=None, **kwargs) -> int:
    out = out_val[0] if isinstance(out_val, (tuple, list)) else out_val
    return out.numel() if torch.is_tensor(out) else 0


def _conv_bias(inp, weight, bias=None, *args, out_val=None, **kwargs) -> int:
    return _output_elements(out_val=out_val) if bias is not None else 0


def _norm(inp, weight, *, training: bool) -> int:
    if training:
        return inp.numel() * (5 if weight is not None else 4)
    return inp.numel() * (2 if weight is not None else 1)


def _batch_norm(inp, weight=None, bias=None, mean=None, var=None, training=False, *a, **k) -> int:
    # native_batch_norm, cudnn_batch_norm, miopen_batch_norm and _native_batch_norm_legit
    # (with running stats): (input, weight, bias, running_mean, running_var, training, ...).
    return _norm(inp, weight, training=bool(training))


def _batch_norm_legit(inp, weight=None, bias=None, *args, **kwargs) -> int:
    # Two overloads: (input, weight, bias, running_mean, running_var, training, momentum, eps)
    # and, without running stats, (input, weight, bias, training, momentum, eps).
    training = args[2] if len(args) >= 5 else (args[0] if args else True)
    return _norm(inp, weight, training=bool(training))


def _batch_norm_train(inp, weight=None, *args, **kwargs) -> int:
    return _norm(inp, weight, training=True)


def _batch_norm_eval(inp, weight=None, *args, **kwargs) -> int:
    return _norm(inp, weight, training=False)


def _layer_norm(inp, normalized_shape, weight=None, *args, **kwargs) -> int:
    return _norm(inp, weight, training=True)


def _group_norm(inp, weight=None, *args, **kwargs) -> int:
    return _norm(inp, weight, training=True)


def _packets(*names: str) -> list:
    """The aten overload packets of this torch build among `names` (some are CUDA or ROCm
    only, or newer than the oldest torch zerostream supports)."""
    return [getattr(aten, n) for n in names if hasattr(aten, n)]


@functools.lru_cache(maxsize=None)
def _other_flops() -> Dict[Any, Callable[..., int]]:
    """DeepSpeed's counts besides torch's MAC formulas (Note [Which operations count]), by
    aten overload packet."""
    other: Dict[Any, Callable[..., int]] = {}
    for op in _packets(
        "relu", "relu_", "hardtanh", "hardtanh_", "elu", "elu_", "leaky_relu", "leaky_relu_",
        "silu", "silu_", "gelu", "gelu_", "_prelu_kernel", "_softmax",
        "avg_pool2d", "avg_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices",
        "_adaptive_avg_pool2d", "_adaptive_avg_pool3d",
        "adaptive_max_pool2d", "adaptive_max_pool3d",
        "mkldnn_max_pool2d", "mkldnn_max_pool3d", "mkldnn_adaptive_avg_pool2d",
    ):  # fmt: skip
        other[op] = _input_elements
    for op in _packets(
        "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
        "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
        "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d",
        "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa",
    ):  # fmt: skip
        other[op] = _output_elements
    for op in _packets("native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm"):
        other[op] = _batch_norm
    for op in _packets("_native_batch_norm_legit"):
        other[op] = _batch_norm_legit
    for op in _packets("_batch_norm_with_update"):
        other[op] = _batch_norm_train
    for op in _packets("_batch_norm_no_update", "_native_batch_norm_legit_no_training"):
        other[op] = _batch_norm_eval
    for op in _packets("native_layer_norm"):
        other[op] = _layer_norm
    for op in _packets("native_group_norm"):
        other[op] = _group_norm
    # The convolutions of torch's registry that take (input, weight, bias, ...) also add their
    # bias; cudnn_convolution and _slow_conv2d_forward lie below aten.convolution, which is the
    # op a dispatch mode sees.
    for op in _packets("convolution", "_convolution", "convolution_overrideable"):
        other[op] = _conv_bias
    return other


def _counted(
    tally: OpTally,
    mac_formula: Optional[Callable[..., int]],
    other: Optional[Callable[..., int]],
) -> Callable[..., int]:
    """A raw FlopCounterMode formula (it gets the op's arguments and `out_val`) that adds to
    `tally` and returns the op's flops: torch's MAC formula plus DeepSpeed's other count."""

    def count(*args, out_val=None, **kwargs) -> int:
        mac_flops = int(mac_formula(*args, out_val=out_val, **kwargs)) if mac_formula else 0
        other_flops = int(other(*args, out_val=out_val, **kwargs)) if other else 0
        tally.add(mac_flops, other_flops)
        return mac_flops + other_flops

    count._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode passes tensors
    return count


def counter_mode(tally: OpTally) -> "FlopCounterMode":
    """A FlopCounterMode (not entered yet) whose every counted op adds to `tally`.

    torch's registry entries take the raw arguments already (FlopCounterMode wraps its
    shape formulas on registration), so they are called as they are."""
    from torch.utils.flop_counter import FlopCounterMode, flop_registry  # 0.3 s: when used

    other = _other_flops()
    mapping = {}
    for op in set(flop_registry) | set(other):
        mapping[op] = _counted(tally, flop_registry.get(op), other.get(op))
    return FlopCounterMode(display=False, custom_mapping=mapping)

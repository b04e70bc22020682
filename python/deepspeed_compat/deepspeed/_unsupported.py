"""The error this package raises where DeepSpeed has a feature zerostream does not."""

from __future__ import annotations


class UnsupportedFeatureError(ImportError, NotImplementedError):
    """A DeepSpeed feature zerostream does not implement. An ImportError too, so code that
    probes an optional DeepSpeed module with `except ImportError` degrades as it would
    without it."""


def unsupported(feature: str, what: str, hint: str = "") -> UnsupportedFeatureError:
    """The error for `what` (the name the user reached), which needs `feature`."""
    message = f"{what}: {feature} is not supported by zerostream"
    if hint:
        message += f"; {hint}"
    return UnsupportedFeatureError(message)


SEQUENCE_PARALLELISM = "sequence parallelism (DeepSpeed Ulysses / ALST)"
TENSOR_PARALLELISM = "tensor parallelism (DeepSpeed AutoTP, tensor_parallel.autotp_size > 1)"
PIPELINE_PARALLELISM = "pipeline parallelism (deepspeed.pipe, PipelineModule)"
INFERENCE = "DeepSpeed-Inference (kernel injection, init_inference)"


class RefusedOnUse:
    """A DeepSpeed class zerostream does not implement, importable (DeepSpeed's own test
    models subclass PipelineModule at import time, and code may import it for an optional
    path) and refused, naming the feature, when built."""

    _feature = ""
    _what = ""
    _hint = ""

    def __init__(self, *args, **kwargs):
        raise unsupported(self._feature, self._what, self._hint)

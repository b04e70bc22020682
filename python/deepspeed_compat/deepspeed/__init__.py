"""DeepSpeed's Python API, served by zerostream: the `deepspeed` compatibility package.

Installed with `pip install --no-build-isolation ./python/deepspeed_compat`, it lets code that
does `import deepspeed` (Hugging Face Trainer and Accelerate, DeepSpeed's examples) train on
zerostream unchanged. Each module here re-exports zerostream under the path DeepSpeed puts
the name at; what zerostream does not implement raises an error naming the feature
(_unsupported.py). The list of paths is pinned by tests/python/compat/test_import_surface.py,
which derives it from what the pinned transformers and accelerate import.
"""

import sys as _sys

import zerostream as _zerostream
from zerostream import add_config_arguments, init_distributed, initialize

from . import (
    _guard,  # refuses to load beside the real DeepSpeed (runs on import)
    accelerator,
    checkpoint,
    checkpointing,
    comm,
    elasticity,
    moe,
    monitor,
    ops,
    profiling,
    runtime,
    utils,
)
from ._api_version import DEEPSPEED_API_VERSION
from ._unsupported import INFERENCE, TENSOR_PARALLELISM, unsupported
from .accelerator import get_accelerator
from .runtime import zero
from .runtime.config import DeepSpeedConfig, DeepSpeedConfigError
from .runtime.engine import DeepSpeedEngine
from .utils import OnDevice, log_dist, logger

# `deepspeed.zero` is `deepspeed.runtime.zero`, as in DeepSpeed; registered so that
# `from deepspeed.zero import Init` works as well as attribute access.
_sys.modules[__name__ + ".zero"] = zero

__version__ = f"{DEEPSPEED_API_VERSION}+zerostream.{_zerostream.__version__}"
version = __version__
__version_major__, __version_minor__, __version_patch__ = (
    int(part) for part in DEEPSPEED_API_VERSION.split(".")
)
# DeepSpeed's build records its git commit here; a zerostream build records none.
git_hash = __git_hash__ = None
git_branch = __git_branch__ = None

_guard.warn_if_stale(_zerostream.__version__)


def tp_model_init(model, tp_size, dtype, config=None, **kwargs):
    """DeepSpeed's AutoTP entry point (transformers calls it when autotp_size > 1)."""
    raise unsupported(
        TENSOR_PARALLELISM,
        "deepspeed.tp_model_init",
        f"asked for tp_size={tp_size}; remove tensor_parallel from the config to train with "
        "ZeRO data parallelism",
    )


def init_inference(model, config=None, **kwargs):
    raise unsupported(INFERENCE, "deepspeed.init_inference")


__all__ = [
    "initialize",
    "init_distributed",
    "add_config_arguments",
    "DeepSpeedEngine",
    "DeepSpeedConfig",
    "DeepSpeedConfigError",
    "accelerator",
    "checkpoint",
    "checkpointing",
    "comm",
    "elasticity",
    "get_accelerator",
    "log_dist",
    "logger",
    "OnDevice",
    "moe",
    "monitor",
    "ops",
    "profiling",
    "runtime",
    "utils",
    "zero",
    "tp_model_init",
    "init_inference",
    "__version__",
]

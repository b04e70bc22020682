"""`deepspeed.git_version_info`: the build facts DeepSpeed records at install time (`ds_report`
and DeepSpeed's test helpers read them). zerostream builds no op at run time: the ops it has
(CPU Adam, Adagrad and Lion, FusedAdam as torch's Adam, async I/O) are compiled into
zerostream._C or are torch's, so they are listed as installed and compatible; the others
(deepspeed.ops.op_builder.ALL_OPS) as neither."""

import torch

from ._api_version import DEEPSPEED_API_VERSION
from .ops.op_builder import ALL_OPS

version = DEEPSPEED_API_VERSION
git_hash = None
git_branch = None
compatible_ops = {name: builder().is_compatible() for name, builder in ALL_OPS.items()}
installed_ops = dict(compatible_ops)
accelerator_name = "cuda" if torch.cuda.is_available() else "cpu"


def _nccl_version() -> str:
    """NCCL's major.minor as torch was built with it, as DeepSpeed's setup records it: for
    any torch built with CUDA, GPU or not ("0.0" for a CPU-only torch). A library query that
    does not initialise CUDA."""
    if torch.version.cuda is None:
        return "0.0"
    try:
        major, minor, *_ = torch.cuda.nccl.version()
        return f"{major}.{minor}"
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return "0.0"


torch_info = {
    "version": ".".join(torch.__version__.split("+")[0].split(".")[:2]),
    "bf16_support": False,  # DeepSpeed's setup records torch.cuda.is_bf16_supported() there
    "cuda_version": ".".join((torch.version.cuda or "0.0").split(".")[:2]),
    "nccl_version": _nccl_version(),
    "hip_version": ".".join((getattr(torch.version, "hip", None) or "0.0").split(".")[:2]),
}

__all__ = [
    "accelerator_name",
    "compatible_ops",
    "git_branch",
    "git_hash",
    "installed_ops",
    "torch_info",
    "version",
]

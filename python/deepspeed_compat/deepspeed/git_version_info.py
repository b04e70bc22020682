"""`deepspeed.git_version_info`: the build facts DeepSpeed records at install time (`ds_report`
and DeepSpeed's test helpers read them). zerostream builds no DeepSpeed ops: its kernels are
compiled into zerostream._C, so no op is listed as installed or compatible."""

import torch

from ._api_version import DEEPSPEED_API_VERSION

version = DEEPSPEED_API_VERSION
git_hash = None
git_branch = None
installed_ops: dict = {}
compatible_ops: dict = {}
accelerator_name = "cuda" if torch.cuda.is_available() else "cpu"
torch_info = {
    "version": ".".join(torch.__version__.split("+")[0].split(".")[:2]),
    "cuda_version": ".".join((torch.version.cuda or "0.0").split(".")[:2]),
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

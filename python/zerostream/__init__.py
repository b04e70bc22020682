"""zerostream: a DeepSpeed-compatible ZeRO runtime with CPU and NVMe offload."""
from ._version import __version__

"""`deepspeed.accelerator`: zerostream's accelerator (CPU or CUDA, DS_ACCELERATOR honoured)."""

from zerostream.accelerator import get_accelerator, set_accelerator

__all__ = ["get_accelerator", "set_accelerator"]

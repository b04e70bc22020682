"""`deepspeed.accelerator`: zerostream's accelerator (CPU or CUDA, DS_ACCELERATOR honoured)."""

from zerostream.accelerator import get_accelerator, set_accelerator

# zerostream runs on these two (DeepSpeed's list names seven more vendors' devices).
SUPPORTED_ACCELERATOR_LIST = ["cuda", "cpu"]


def is_current_accelerator_supported() -> bool:
    """Whether the accelerator in use is one zerostream runs on (DeepSpeed's test helpers
    import it)."""
    return get_accelerator().device_name() in SUPPORTED_ACCELERATOR_LIST


__all__ = [
    "SUPPORTED_ACCELERATOR_LIST",
    "get_accelerator",
    "is_current_accelerator_supported",
    "set_accelerator",
]

"""`deepspeed.runtime.swap_tensor`: the size below which DeepSpeed keeps a tensor off NVMe
(1 MiB, `MIN_AIO_BYTES`); tests size their models from it to reach the swapped path."""

MIN_AIO_BYTES = 1024**2
AIO_ALIGNED_BYTES = 1024
MIN_SWAPPABLE_BYTES = MIN_AIO_BYTES

__all__ = ["AIO_ALIGNED_BYTES", "MIN_AIO_BYTES", "MIN_SWAPPABLE_BYTES"]

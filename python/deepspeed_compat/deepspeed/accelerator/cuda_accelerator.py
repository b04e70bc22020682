"""`deepspeed.accelerator.cuda_accelerator`: DeepSpeed's class name for the CUDA accelerator,
over zerostream's (`set_accelerator(CUDA_Accelerator())` selects it, as in DeepSpeed)."""

from zerostream.accelerator import CudaAccelerator


class CUDA_Accelerator(CudaAccelerator):  # noqa: N801 (DeepSpeed's name)
    """zerostream's CUDA accelerator under DeepSpeed's name."""


__all__ = ["CUDA_Accelerator"]

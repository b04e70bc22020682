"""`deepspeed.accelerator.cpu_accelerator`: DeepSpeed's class name for the CPU accelerator, over
zerostream's (`set_accelerator(CPU_Accelerator())` selects it, as in DeepSpeed)."""

from zerostream.accelerator import CpuAccelerator


class CPU_Accelerator(CpuAccelerator):  # noqa: N801 (DeepSpeed's name)
    """zerostream's CPU accelerator under DeepSpeed's name."""


__all__ = ["CPU_Accelerator"]

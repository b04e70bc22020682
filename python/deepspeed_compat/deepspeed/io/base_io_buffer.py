"""`deepspeed.io.base_io_buffer` (zerostream.checkpoint.io_buffer)."""

from zerostream.checkpoint.io_buffer import Base_IO_Buffer

__all__ = ["Base_IO_Buffer"]

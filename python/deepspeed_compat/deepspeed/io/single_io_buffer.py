"""`deepspeed.io.single_io_buffer` (zerostream.checkpoint.io_buffer)."""

from zerostream.checkpoint.io_buffer import Single_IO_Buffer

__all__ = ["Single_IO_Buffer"]

"""`deepspeed.io.double_io_buffer` (zerostream.checkpoint.io_buffer)."""

from zerostream.checkpoint.io_buffer import INVALID_BUFFER_INDEX, NUM_BUFFERS, Double_IO_Buffer

__all__ = ["Double_IO_Buffer", "INVALID_BUFFER_INDEX", "NUM_BUFFERS"]

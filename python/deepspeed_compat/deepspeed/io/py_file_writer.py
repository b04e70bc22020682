"""`deepspeed.io.py_file_writer` (zerostream.checkpoint.file_writer)."""

from zerostream.checkpoint.file_writer import PyFileWriter

__all__ = ["PyFileWriter"]

"""`deepspeed.io.mock_file_writer` (zerostream.checkpoint.file_writer)."""

from zerostream.checkpoint.file_writer import MockFileWriter

__all__ = ["MockFileWriter"]

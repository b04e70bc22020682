"""`deepspeed.io`: DeepSpeed's checkpoint file writers, zerostream's (zerostream.checkpoint:
file_writer.py, fast_file_writer.py, io_buffer.py). Each is a file object `torch.save`
writes into: `PyFileWriter(path)` through plain Python file I/O, `MockFileWriter(path)`
counting what would be written, `FastFileWriter(path, FastFileWriterConfig(...))` staging
the bytes in a pinned tensor and writing them through an aio handle."""

from zerostream.checkpoint.fast_file_writer import FastFileWriter, FastFileWriterConfig
from zerostream.checkpoint.file_writer import MockFileWriter, PyFileWriter

__all__ = ["FastFileWriter", "FastFileWriterConfig", "MockFileWriter", "PyFileWriter"]

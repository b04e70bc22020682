"""`deepspeed.io`: DeepSpeed's fast checkpoint writer, zerostream's
(zerostream.checkpoint.fast_file_writer): `torch.save(obj, FastFileWriter(path, config))`
stages the bytes in the config's pinned tensor and writes them through its aio handle."""

from zerostream.checkpoint.fast_file_writer import FastFileWriter, FastFileWriterConfig

__all__ = ["FastFileWriter", "FastFileWriterConfig"]

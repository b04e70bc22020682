"""`deepspeed.io.fast_file_writer` (zerostream.checkpoint.fast_file_writer)."""

from zerostream.checkpoint.fast_file_writer import (
    FASTIO_STAT_KEYS,
    FastFileWriter,
    FastFileWriterConfig,
)

__all__ = ["FASTIO_STAT_KEYS", "FastFileWriter", "FastFileWriterConfig"]

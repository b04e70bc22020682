"""`deepspeed.runtime.model_checkpointing.data_parallel_writer_factory`: the writer
assignment a FastCheckpointEngine takes (zerostream.checkpoint.checkpoint_engines)."""

from zerostream.checkpoint.checkpoint_engines import DataParallelWriterConfig

__all__ = ["DataParallelWriterConfig"]

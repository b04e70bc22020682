"""`deepspeed.runtime.model_checkpointing`: the `checkpoint` section's names and the writer
assignment the checkpoint engines take (deepspeed.runtime.checkpoint_engine). DeepSpeed's
CheckpointWriterFactory is FastCheckpointEngine.create_writer here."""

from .constants import *  # noqa: F403 - DeepSpeed's package exposes its constants
from .data_parallel_writer_factory import DataParallelWriterConfig  # noqa: F401

"""`deepspeed.runtime.checkpoint_engine.fast_checkpoint_engine`: zerostream's
(zerostream.checkpoint.checkpoint_engines)."""

from zerostream.checkpoint.checkpoint_engines import (
    CheckpointCommitInfo,
    CheckpointEngine,
    FastCheckpointEngine,
)

__all__ = ["CheckpointCommitInfo", "CheckpointEngine", "FastCheckpointEngine"]

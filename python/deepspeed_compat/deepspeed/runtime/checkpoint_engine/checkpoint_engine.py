"""`deepspeed.runtime.checkpoint_engine.checkpoint_engine`: zerostream's
(zerostream.checkpoint.checkpoint_engines)."""

from zerostream.checkpoint.checkpoint_engines import CheckpointCommitInfo, CheckpointEngine

__all__ = ["CheckpointCommitInfo", "CheckpointEngine"]

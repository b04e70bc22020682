"""`deepspeed.runtime.checkpoint_engine.decoupled_checkpoint_engine`: the class imports and
refuses when built (saving in a background process is not built in zerostream)."""

from zerostream.checkpoint.checkpoint_engines import (
    CheckpointCommitInfo,
    CheckpointEngine,
    DecoupledCheckpointEngine,
)

ENGINE_NAME = "DecoupledCheckpointEngine"

__all__ = ["CheckpointCommitInfo", "CheckpointEngine", "DecoupledCheckpointEngine", "ENGINE_NAME"]

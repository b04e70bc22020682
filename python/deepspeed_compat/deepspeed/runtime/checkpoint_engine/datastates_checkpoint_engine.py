"""`deepspeed.runtime.checkpoint_engine.datastates_checkpoint_engine`: the class imports and
refuses when built (DataStates-LLM's engine is not built in zerostream)."""

from zerostream.checkpoint.checkpoint_engines import (
    CheckpointCommitInfo,
    CheckpointEngine,
    DataStatesCheckpointEngine,
)

ENGINE_NAME = "DataStatesCheckpointEngine"

__all__ = ["CheckpointCommitInfo", "CheckpointEngine", "DataStatesCheckpointEngine", "ENGINE_NAME"]

"""`deepspeed.runtime.checkpoint_engine.nebula_checkpoint_engine`: the class imports (DeepSpeed's
module needs torch_nebula to import at all) and refuses when built."""

from zerostream.checkpoint.checkpoint_engines import (
    CheckpointCommitInfo,
    CheckpointEngine,
    NebulaCheckpointEngine,
)

__all__ = ["CheckpointCommitInfo", "CheckpointEngine", "NebulaCheckpointEngine"]

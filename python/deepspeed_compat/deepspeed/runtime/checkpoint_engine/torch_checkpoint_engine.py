"""`deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine`: zerostream's
(zerostream.checkpoint.checkpoint_engines)."""

from zerostream.checkpoint.checkpoint_engines import (
    CheckpointCommitInfo,
    CheckpointEngine,
    TorchCheckpointEngine,
)

ENGINE_NAME = "TorchCheckpointEngine"

__all__ = ["CheckpointCommitInfo", "CheckpointEngine", "ENGINE_NAME", "TorchCheckpointEngine"]

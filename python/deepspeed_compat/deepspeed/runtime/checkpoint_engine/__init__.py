"""`deepspeed.runtime.checkpoint_engine`: DeepSpeed's checkpoint engines, zerostream's
(zerostream.checkpoint.checkpoint_engines): TorchCheckpointEngine and FastCheckpointEngine
work; DecoupledCheckpointEngine, NebulaCheckpointEngine and DataStatesCheckpointEngine
refuse when built, naming what is not built and what to use instead."""

from zerostream.checkpoint.checkpoint_engines import (
    CheckpointCommitInfo,
    CheckpointEngine,
    DataStatesCheckpointEngine,
    DecoupledCheckpointEngine,
    FastCheckpointEngine,
    NebulaCheckpointEngine,
    TorchCheckpointEngine,
    create_checkpoint_engine,
)

__all__ = [
    "CheckpointCommitInfo",
    "CheckpointEngine",
    "DataStatesCheckpointEngine",
    "DecoupledCheckpointEngine",
    "FastCheckpointEngine",
    "NebulaCheckpointEngine",
    "TorchCheckpointEngine",
    "create_checkpoint_engine",
]

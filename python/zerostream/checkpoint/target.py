"""What a checkpoint saves and loads, as the engine describes it, and the training counters a
load gives back.

The engine builds a CheckpointTarget for each save_checkpoint/load_checkpoint call and
applies the counters a load returns to itself: checkpoint/ reads no engine attribute and
writes none. Where the module's weights and the optimizer's state live is the stage's
knowledge, reached through `stage` (a StageCheckpoint, Note [Stage checkpoints] in
zero/protocol.py); checkpoint/ knows the files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple

import torch

if TYPE_CHECKING:
    from ..config import AioConfig, CheckpointConfig


@dataclass(frozen=True)
class TrainingCounters:
    """The engine's counters a checkpoint carries (its model-states file's keys)."""

    global_steps: int = 0
    global_samples: int = 0
    skipped_steps: int = 0


@dataclass(frozen=True)
class LoadResult:
    """What load_checkpoint gives back: the model-states file read and the client's state
    (None: nothing was loaded), and the counters the engine sets (None: not loaded, as with
    load_module_only)."""

    path: Optional[str] = None
    client_state: Optional[dict] = None
    counters: Optional[TrainingCounters] = None


@dataclass(frozen=True)
class CheckpointTarget:
    module: torch.nn.Module
    # The stage's side of the checkpoint (zero/protocol.py StageCheckpoint): its weights,
    # its optimizer state, and where each lives.
    stage: Any
    lr_scheduler: Any
    checkpoint: "CheckpointConfig"
    aio: "AioConfig"
    aio_keys: Tuple[str, ...]  # the keys the run's ds_config `aio` section sets
    ds_config: dict  # written into every file, as DeepSpeed does
    global_rank: int
    world_size: int
    dp_rank: int
    dp_world_size: int
    mp_world_size: int
    bf16: bool  # the optimizer files' name prefix
    train_batch_size: int  # global_samples of a checkpoint that has none
    counters: TrainingCounters  # what a save writes
    # Called with why the engine's state cannot be trained on after a load that failed part
    # way (Note [A load that fails part way] in load.py), and with None once a load succeeded.
    set_inconsistent: Callable[[Optional[str]], None]

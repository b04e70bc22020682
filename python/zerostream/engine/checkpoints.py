"""The engine's checkpoints: what checkpoint/ saves and loads for it (a CheckpointTarget)
and the whole 16-bit weights. A collaborator the engine holds (its save_checkpoint,
load_checkpoint and save_16bit_model call it), built from the records it reads: the config,
the module, the stage's class, the ranks, the counters (the one thing a load writes back) and
the run state. The optimizer and the LR scheduler come with each call, as the engine holds them
then."""

from __future__ import annotations

import logging
import os

import torch

from .. import comm
from ..checkpoint import load_checkpoint, save_checkpoint
from ..checkpoint.layout import optim_states_name
from ..checkpoint.target import CheckpointTarget
from ..config import DeepSpeedConfig
from ..zero.protocol import RunState
from .records import EngineCounters, Ranks

logger = logging.getLogger("zerostream")


class EngineCheckpoints:
    def __init__(
        self,
        config: DeepSpeedConfig,
        ds_config: dict,
        module: torch.nn.Module,
        stage: type,
        ranks: Ranks,
        counters: EngineCounters,
        run: RunState,
    ):
        self._config = config
        self._ds_config = ds_config
        self._module = module
        self._stage = stage
        self._ranks = ranks
        self._counters = counters
        self._run = run

    def target(self, optimizer, lr_scheduler) -> CheckpointTarget:
        """What checkpoint/ saves and loads (checkpoint/target.py): the stage's side of it
        (Note [Stage checkpoints] in zero/protocol.py), the config sections it reads, this
        rank's place, and the counters a save writes."""
        cfg, ranks = self._config, self._ranks
        return CheckpointTarget(
            module=self._module,
            stage=self._stage.checkpointer(self._module, optimizer),
            lr_scheduler=lr_scheduler,
            checkpoint=cfg.checkpoint,
            aio=cfg.aio,
            aio_keys=tuple((cfg.raw.get("aio") or {}).keys()),
            ds_config=self._ds_config,
            global_rank=ranks.global_rank,
            world_size=ranks.world_size,
            dp_rank=ranks.dp_rank,
            dp_world_size=ranks.dp_world_size,
            mp_world_size=ranks.mp_world_size,
            bf16=cfg.bf16.enabled,
            train_batch_size=cfg.train_batch_size,
            counters=self._counters.saved(),
            set_inconsistent=self._run.set_inconsistent,
        )

    def save(self, optimizer, lr_scheduler, save_dir: str, tag, *options) -> bool:
        """checkpoint/save.py's save_checkpoint, refused while a failed load left the state
        inconsistent."""
        self._run.require_consistent("save_checkpoint")
        return save_checkpoint(self.target(optimizer, lr_scheduler), save_dir, tag, *options)

    def load(self, optimizer, lr_scheduler, load_dir: str, tag, *options):
        """checkpoint/load.py's load_checkpoint; the counters it read become the engine's."""
        loaded = load_checkpoint(self.target(optimizer, lr_scheduler), load_dir, tag, *options)
        if loaded.counters is not None:
            self._counters.restore(loaded.counters)
        return loaded.path, loaded.client_state

    def optimizer_file(self, checkpoints_path: str, tag) -> str:
        name = optim_states_name(self._ranks.dp_rank, self._config.bf16.enabled)
        return os.path.join(checkpoints_path, str(tag), name)

    def whole_16bit_weights(self, exclude_frozen: bool):
        return self._stage.whole_16bit_weights(self._module, exclude_frozen)

    def save_16bit_model(self, save_dir: str, save_filename: str, exclude_frozen: bool) -> bool:
        stage = self._stage
        zero = self._config.zero_optimization
        if stage.gathers_to_save and not zero.stage3_gather_16bit_weights_on_model_save:
            logger.warning(
                "save_16bit_model: nothing written; at ZeRO stage 3 set "
                "zero_optimization.stage3_gather_16bit_weights_on_model_save to true "
                "to gather the weights into one file"
            )
            return False
        state = stage.whole_16bit_weights(self._module, exclude_frozen)
        if state is not None:
            os.makedirs(save_dir, exist_ok=True)
            torch.save(state, os.path.join(save_dir, save_filename))
        comm.barrier()
        return True

"""The engine's checkpoints, by DeepSpeed's method names (`save_checkpoint`, `load_checkpoint`,
`save_16bit_model`): what checkpoint/ saves and loads for it (a CheckpointTarget) and the whole
16-bit weights. A collaborator the engine holds (its methods of the same names call these),
built from the records it reads: the config, the module, the stage's class, the ranks, the
counters (the one thing a load writes back), the optimizer and LR scheduler, and the run
state."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Optional, Type

import torch

from .. import comm
from ..checkpoint import load_checkpoint, save_checkpoint
from ..checkpoint.checkpoint_engines import TorchCheckpointEngine
from ..checkpoint.layout import optim_states_name
from ..checkpoint.target import CheckpointTarget
from ..config import DeepSpeedConfig
from ..zero.protocol import RunState
from .records import EngineCounters, Ranks, TrainingParts

if TYPE_CHECKING:
    from ..zero.base import ZeroOptimizerBase

logger = logging.getLogger("zerostream")


class EngineCheckpoints:
    def __init__(
        self,
        config: DeepSpeedConfig,
        ds_config: dict,
        module: torch.nn.Module,
        stage: "Type[ZeroOptimizerBase]",
        ranks: Ranks,
        counters: EngineCounters,
        parts: TrainingParts,
        run: RunState,
    ):
        self._config = config
        self._ds_config = ds_config
        self._module = module
        self._stage = stage
        self._ranks = ranks
        self._counters = counters
        self._parts = parts
        self._run = run
        # DeepSpeed's `engine.checkpoint_engine`, for scripts that save or load extra files
        # with it or ask it about a save in flight: a synchronous torch.save engine in the
        # config's serialization. It tells the truth about save_checkpoint (nothing is left
        # in flight: is_decoupled() False, get_commit_info() None, cleanup() nothing), but
        # save_checkpoint and load_checkpoint write and read through checkpoint/ themselves,
        # so replacing its methods does not change them.
        self.checkpoint_engine = TorchCheckpointEngine(config)

    def save_checkpoint(
        self,
        save_dir: str,
        tag=None,
        client_state: Optional[dict] = None,
        save_latest: bool = True,
        exclude_frozen_parameters: bool = False,
    ) -> bool:
        """DeepSpeed's layout under save_dir/tag (default tag global_step<N>), written
        crash-safely; `latest` is replaced last. All ranks must call it."""
        self._run.require_consistent("save_checkpoint")
        return save_checkpoint(
            self.target(),
            save_dir,
            tag,
            client_state,
            save_latest,
            exclude_frozen_parameters,
        )

    def load_checkpoint(
        self,
        load_dir: str,
        tag=None,
        load_module_strict: bool = True,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
        load_module_only: bool = False,
        custom_load_fn=None,
    ):
        """(path, client_state), or (None, None) when load_dir has no `latest` (and no tag
        was given). A checkpoint of another data-parallel size is resharded."""
        loaded = load_checkpoint(
            self.target(),
            load_dir,
            tag,
            load_module_strict,
            load_optimizer_states,
            load_lr_scheduler_states,
            load_module_only,
            custom_load_fn,
        )
        if loaded.counters is not None:
            self._counters.restore(loaded.counters)
        return loaded.path, loaded.client_state

    def target(self) -> CheckpointTarget:
        """What checkpoint/ saves and loads (checkpoint/target.py): the stage's side of it
        (Note [Stage checkpoints] in zero/protocol.py), the config sections it reads, this
        rank's place, and the counters a save writes."""
        cfg, ranks, parts = self._config, self._ranks, self._parts
        self._settle(parts.optimizer)
        return CheckpointTarget(
            module=self._module,
            stage=self._stage.checkpointer(self._module, parts.optimizer),
            lr_scheduler=parts.lr_scheduler,
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

    @staticmethod
    def _settle(optimizer) -> None:
        """A checkpoint reads the shards and the optimizer's state directly: an update running
        behind the forward (zero/overlap.py) ends first."""
        if optimizer is not None:  # every ZeRO optimizer has it (zero/base.py)
            optimizer.settle_update()

    # --- whole weights ---------------------------------------------------------------------------
    def _get_optimizer_ckpt_name(self, checkpoints_path: str, tag, expp_rank: int = 0) -> str:
        """DeepSpeed's name for the file this rank's optimizer state is saved in under `tag`
        (its tests patch it to see whether a load reads optimizer state). zerostream writes
        the ZeRO layout's file for every stage; expert ranks do not exist here."""
        name = optim_states_name(self._ranks.dp_rank, self._config.bf16.enabled)
        return os.path.join(checkpoints_path, str(tag), name)

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False):
        """The whole 16-bit weights on rank 0 (None elsewhere); all ranks must call it."""
        self._settle(self._parts.optimizer)
        return self._stage.whole_16bit_weights(self._module, exclude_frozen_parameters)

    def save_16bit_model(
        self,
        save_dir: str,
        save_filename: str = "pytorch_model.bin",
        exclude_frozen_parameters: bool = False,
    ) -> bool:
        """Rank 0 writes the module's weights to save_dir/save_filename. At stage 3 only
        with zero_optimization.stage3_gather_16bit_weights_on_model_save (else returns False,
        as DeepSpeed does); all ranks must call it."""
        stage = self._stage
        zero = self._config.zero_optimization
        if stage.gathers_to_save and not zero.stage3_gather_16bit_weights_on_model_save:
            logger.warning(
                "save_16bit_model: nothing written; at ZeRO stage 3 set "
                "zero_optimization.stage3_gather_16bit_weights_on_model_save to true "
                "to gather the weights into one file"
            )
            return False
        self._settle(self._parts.optimizer)
        state = stage.whole_16bit_weights(self._module, exclude_frozen_parameters)
        if state is not None:
            os.makedirs(save_dir, exist_ok=True)
            torch.save(state, os.path.join(save_dir, save_filename))
        comm.barrier()
        return True

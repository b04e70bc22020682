"""engine.load_checkpoint (reference §3.4): resolve the tag, check the checkpoint belongs to
this model, have the stage restore the module, then (unless asked not to) the optimizer
partitions and the LR scheduler, and give the engine back the counters. A checkpoint saved
with another data-parallel world size, or whose partitions are cut otherwise, is re-cut
(reshard.py). With checkpoint.load_universal the tag names a universal checkpoint
(universal_load.py; `latest_universal` when no tag is given), re-cut the same way. Every
failure names the file or the parameter.

What is loaded where is the stage's (Note [Stage checkpoints] in zero/protocol.py): this
module reads the files, decides which the stage needs, and maps and re-cuts what it hands
over into the stage's own layout.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .. import comm
from ..lazy_tensor import materialize
from . import files, layout, migrate, reshard, universal_load
from .files import Checkpoint
from .target import CheckpointTarget, LoadResult, TrainingCounters

logger = logging.getLogger("zerostream")

# Keys of the model-states file that are the engine's, not the client's.
ENGINE_KEYS = frozenset(
    {
        "module",
        "buffer_names",
        "optimizer",
        "param_shapes",
        "frozen_param_shapes",
        "frozen_param_fragments",
        "shared_params",
        "lr_scheduler",
        "data_sampler",
        "random_ltd",
        "sparse_tensor_module_names",
        "skipped_steps",
        "global_steps",
        "global_samples",
        "dp_world_size",
        "mp_world_size",
        "checkpoint_parallel_dimensions",
        "ds_config",
        "ds_version",
        "universal_checkpoint_info",
    }
)


class SavedModel:
    """This rank's model-states file as the stage reads it (zero/protocol.py SavedWeights),
    with the facts of the save it tells: were the weights sharded, how many ranks saved."""

    def __init__(self, ckpt: Checkpoint, name: str, sd: dict, dp_world_size: int):
        self.ckpt = ckpt
        self.module = sd["module"]
        self.buffer_names = sd.get("buffer_names", [])
        self.trained = {n for group in sd.get("param_shapes") or [] for n in group}
        self.frozen_fragments = sd.get("frozen_param_fragments") or {}
        # Per-rank model files are stage 3's; a single file lists the optimizer's parameter
        # groups at stages 1/2 (reference §3.2: stage 0 writes no param_shapes).
        self.sharded = name != layout.model_states_name(0, sharded=False)
        self.partitioned = self.sharded or bool(sd.get("param_shapes"))
        self.world = int(sd.get("dp_world_size", dp_world_size))
        self.same_world = self.world == dp_world_size

    def consolidated(self) -> Dict[str, torch.Tensor]:
        return reshard.consolidated_fp32(self.ckpt.dir)

    def frozen(self) -> Dict[str, torch.Tensor]:
        return reshard.frozen_fp32(self.ckpt, self.world)


def _module_shapes(module: torch.nn.Module) -> Dict[str, torch.Size]:
    return {n: layout.full_shape(p) for n, p in module.named_parameters()}


def check_model(ckpt: Checkpoint, name: str, sd: dict, module: torch.nn.Module) -> None:
    """Raises naming the parameter when the checkpoint's shapes differ from the model's."""
    saved: Dict[str, torch.Size] = {}
    for shapes in sd.get("param_shapes") or []:
        saved.update(shapes)
    saved.update(sd.get("frozen_param_shapes") or {})
    if not saved:  # stage 0: the module state holds whole tensors
        params = dict(module.named_parameters())
        saved = {k: v.shape for k, v in sd["module"].items() if k in params}
    ours = _module_shapes(module)
    for pname, shape in saved.items():
        if pname in ours and torch.Size(shape) != ours[pname]:
            raise ValueError(
                f"checkpoint {ckpt.path(name)} is from a different model: parameter "
                f"{pname!r} has shape {tuple(shape)} there and {tuple(ours[pname])} here"
            )


def _zero_state(
    ckpt: Checkpoint, sd: dict, target: CheckpointTarget, part, saved: SavedModel
) -> dict:
    """This rank's ZeRO optimizer state: its own file when the checkpoint's partitions are
    cut as this run cuts them (same world size and layout; `part`: the stage's
    PartitionLayout), else re-cut by parameter name from every rank's file (reshard.py).
    DeepSpeed's files are mapped by migrate.py."""
    if saved.same_world:
        name = ckpt.optim_file(target.dp_rank, target.bf16)
        where = ckpt.path(name)
        # lazy: the optimizer streams its large tensors from the file into their places.
        state = migrate.zero_state(ckpt.load(name, lazy=True)["optimizer_state_dict"], part, where)
        if migrate.same_layout(sd, state, target.module, part, saved.same_world):
            return migrate.with_param_groups(state, part, where)
    return reshard.optimizer_state(ckpt, sd, target.module, part, target.bf16, saved.world)


def _latest_tag(load_dir: str) -> Optional[str]:
    path = os.path.join(load_dir, files.LATEST)
    if not os.path.isfile(path):
        logger.warning(
            "load_checkpoint: no 'latest' file at %s; pass tag= to load a particular "
            "checkpoint. Nothing was loaded.",
            path,
        )
        return None
    return layout.read_latest(load_dir)


def load_checkpoint(
    target: CheckpointTarget,
    load_dir: str,
    tag: Optional[str] = None,
    load_module_strict: bool = True,
    load_optimizer_states: bool = True,
    load_lr_scheduler_states: bool = True,
    load_module_only: bool = False,
    custom_load_fn: Optional[Callable] = None,
) -> LoadResult:
    """The model-states file read, the client state and the counters to apply (all None
    when there is nothing to load; the counters also with load_module_only). All ranks must
    call it; see Note [A load that fails part way]."""
    universal = target.checkpoint.load_universal
    if tag is None:
        tag = universal_load.latest_tag(load_dir) if universal else _latest_tag(load_dir)
        if tag is None:
            return LoadResult()
    where = os.path.join(load_dir, str(tag))
    touched: List[bool] = [False]
    error: Optional[BaseException] = None
    result = LoadResult()
    try:
        result = (_load_universal if universal else _load_local)(
            target,
            files.resolve_tag_dir(load_dir, str(tag)),
            touched,
            load_module_strict,
            load_optimizer_states and not load_module_only,
            load_lr_scheduler_states,
            load_module_only,
            custom_load_fn,
        )
    except BaseException as exc:  # every rank must hear of it before any gathers
        error = exc
    outcomes = _outcomes(target, error is not None, touched[0])
    failed = [r for r, (bad, _) in enumerate(outcomes) if bad]
    if failed:
        if any(changed for _, changed in outcomes):
            target.set_inconsistent(
                f"load_checkpoint({where!r}) failed on rank(s) {failed} after it had begun "
                f"to overwrite the weights and optimizer state, so this engine holds a mix of "
                f"the checkpoint and its earlier state; load a checkpoint again (the files on "
                f"disk were not changed) or build a new engine"
            )
        if error is not None:
            raise error
        raise RuntimeError(
            f"load_checkpoint: rank(s) {failed} could not load their part of {where}"
            + ("; see the error on that rank" if len(failed) == 1 else "")
        )
    if touched[0]:
        target.stage.publish_loaded(load_optimizer_states and not load_module_only)
    target.set_inconsistent(None)
    comm.barrier()
    return result


# Note [A load that fails part way]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Large tensors are read straight from the files into the engine's partitions (stream.py),
# and each is checked against the manifest as it is read, so a damaged payload is found
# after earlier ones were already copied in. Reading every file twice (check, then load)
# would halve the load's bandwidth. Instead a load runs in two halves:
# - the local half reads and writes this rank's state only, with no collective, and records
#   whether it began to overwrite anything (`touched`);
# - all ranks then exchange (failed, touched); when any failed, every rank raises (naming
#   the ranks) instead of entering the collective half and waiting on a peer that left, and
#   if any state was overwritten the engine refuses forward/backward/step/save until a load
#   succeeds (CheckpointTarget.set_inconsistent: the engine's run state), so a half-loaded
#   model never trains or is saved;
# - else the collective half gathers the loaded partitions into every rank's weights.
# A failure before anything was overwritten (no checkpoint, another model's shapes, a
# damaged header) leaves the engine as it was and usable.


def _outcomes(target: CheckpointTarget, failed: bool, touched: bool) -> List[Tuple[bool, bool]]:
    """(failed, touched) of every rank."""
    if target.world_size == 1:
        return [(failed, touched)]
    outcomes: List[Any] = [None] * target.world_size
    comm.all_gather_object(outcomes, (failed, touched))
    return [tuple(o) for o in outcomes]


def _model_file(ckpt: Checkpoint, sharded: bool, dp_rank: int) -> Optional[str]:
    """The model-states file this rank reads: its own layout's, else the other layout's
    (a checkpoint saved at another stage, or a sharded one saved by fewer ranks)."""
    names = [layout.model_states_name(dp_rank, sharded), layout.model_states_name(0, True)]
    if sharded:
        names.append(layout.model_states_name(0, sharded=False))
    for name in names:
        if os.path.isfile(ckpt.path(name)):
            return name
    return None


def _load_local(
    target: CheckpointTarget,
    tag_dir: str,
    touched: List[bool],
    strict: bool,
    want_optimizer: bool,
    load_lr_scheduler_states: bool,
    load_module_only: bool,
    custom_load_fn: Optional[Callable],
) -> LoadResult:
    """This rank's half of load_checkpoint: no collective. touched[0] turns True just
    before the first write into the run's state."""
    ckpt = Checkpoint(tag_dir, files.io_engine_for(target))
    stage = target.stage
    model_name = _model_file(ckpt, stage.sharded_weights, target.dp_rank)
    if model_name is None:  # DeepSpeed's answer too: a warning and (None, None)
        logger.warning(
            "load_checkpoint: %s has no model-states file (%s); nothing was loaded",
            ckpt.dir,
            layout.model_states_name(target.dp_rank, stage.sharded_weights),
        )
        return LoadResult()
    # lazy: whole weights are read straight into the module (zero/checkpoint.py).
    sd = ckpt.load(model_name, lazy=not stage.sharded_weights)
    sd = {k: v if k == "module" else materialize(v) for k, v in sd.items()}
    check_model(ckpt, model_name, sd, target.module)
    saved = SavedModel(ckpt, model_name, sd, target.dp_world_size)
    part = stage.partition_layout() if want_optimizer else None
    want_optimizer = part is not None
    if want_optimizer and saved.partitioned != part.partitioned:
        raise ValueError(
            f"load_checkpoint: {ckpt.dir} was saved at ZeRO stage "
            f"{'1-3' if saved.partitioned else '0'} and this run is stage {part.zero_stage}; "
            f"optimizer state moves between stages 1, 2 and 3 only. Pass "
            f"load_optimizer_states=False to load the weights alone (nothing was loaded)"
        )
    if want_optimizer and part.partitioned and universal_load.is_universal(ckpt.dir):
        raise ValueError(
            f"load_checkpoint: {ckpt.dir} is a universal checkpoint (ds_to_universal's "
            f"zero/<param>/ files, no per-rank optimizer states); set "
            f"checkpoint.load_universal to true to load it (nothing was loaded)"
        )
    lr_unsaved = False

    touched[0] = True
    stage.load_module(saved, strict, custom_load_fn, want_optimizer)
    if not want_optimizer:
        stage.loaded_without_optimizer()
    elif part.partitioned:
        state = _zero_state(ckpt, sd, target, part, saved)
        stage.load_partition_state(state)
        lr_unsaved = bool(state.get(migrate.NO_HYPERPARAMETERS))
    elif sd.get("optimizer") is not None:  # stage 0: it rides in the model-states file
        path = ckpt.path(model_name)
        stage.load_partition_state(migrate.stage0_state(sd["optimizer"], part, path))

    return _result(
        target, sd, ckpt.path(model_name), load_module_only, load_lr_scheduler_states, lr_unsaved
    )


def _result(
    target: CheckpointTarget,
    sd: dict,
    path: str,
    load_module_only: bool,
    load_lr_scheduler_states: bool,
    lr_unsaved: bool,
) -> LoadResult:
    """The LR scheduler restored, and the counters and client state to give back."""
    counters = None
    deepspeed_states = {"module"}
    if not load_module_only:
        scheduler = target.lr_scheduler
        saved_scheduler = sd.get("lr_scheduler")
        if load_lr_scheduler_states and scheduler is not None and saved_scheduler is not None:
            scheduler.load_state_dict(saved_scheduler)
            if lr_unsaved:
                migrate.lr_from_scheduler(scheduler)
        steps = int(sd.get("global_steps", 0))
        counters = TrainingCounters(
            global_steps=steps,
            global_samples=int(sd.get("global_samples", steps * target.train_batch_size)),
            skipped_steps=int(sd.get("skipped_steps", 0)),
        )
        deepspeed_states = ENGINE_KEYS
    client_state = {k: v for k, v in sd.items() if k not in deepspeed_states}
    return LoadResult(path, client_state, counters)


def _load_universal(
    target: CheckpointTarget,
    tag_dir: str,
    touched: List[bool],
    strict: bool,
    want_optimizer: bool,
    load_lr_scheduler_states: bool,
    load_module_only: bool,
    custom_load_fn: Optional[Callable],
) -> LoadResult:
    """This rank's half of load_checkpoint from a universal checkpoint (universal_load.py):
    the weights and this rank's optimizer partitions cut by parameter name for this run's
    world size and stage. No collective."""
    ckpt = Checkpoint(tag_dir, files.io_engine_for(target))
    uc = universal_load.UniversalCheckpoint(tag_dir, ckpt)
    stage = target.stage
    sd = materialize(ckpt.load(uc.model_name))
    check_model(ckpt, uc.model_name, sd, target.module)
    part = stage.partition_layout() if want_optimizer else None
    want_optimizer = part is not None
    if want_optimizer and not part.partitioned:
        raise NotImplementedError(
            f"load_checkpoint({tag_dir!r}): checkpoint.load_universal loads into ZeRO stages "
            f"1-3; this run is stage 0. Pass load_optimizer_states=False to load the weights "
            f"alone, or run at stage 1-3 (nothing was loaded)"
        )
    trained_here = set()
    if want_optimizer:
        names = layout.param_shapes(target.module, part.groups)
        trained_here = {n for group in names for n in group}
        shapes = {n: s for group in names for n, s in group.items()}
        # Read (lazily) and checked before anything is overwritten.
        saved = uc.saved_state(sd, [n for group in names for n in group], shapes)
        scaler = saved.globals.get("loss_scaler")
        saved.globals["loss_scaler"] = migrate.scaler_state(scaler, part.loss_scaler, uc.optim_path)
        saved.globals.setdefault("overflow", False)
    weights = uc.weights(sd, target.module, trained_here)

    touched[0] = True
    stage.load_module(weights, strict, custom_load_fn, want_optimizer)
    if not want_optimizer:
        stage.loaded_without_optimizer()
    else:
        stage.load_partition_state(reshard.recut(saved, target.module, part))
    return _result(
        target, sd, ckpt.path(uc.model_name), load_module_only, load_lr_scheduler_states, False
    )

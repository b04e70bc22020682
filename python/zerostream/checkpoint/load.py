"""engine.load_checkpoint (reference §3.4): resolve the tag, check the checkpoint belongs to
this model, restore the module, then (unless asked not to) the optimizer partitions, the LR
scheduler and the counters. A checkpoint saved with another data-parallel world size is
resharded (reshard.py). Every failure names the file or the parameter.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import torch

from .. import comm
from ..zero.stage3.optimizer import runtime_of
from ..zero.stage3.param import zero_param_of
from . import files, layout, migrate, reshard, stream

if TYPE_CHECKING:
    from ..engine import ZeroEngine
    from ..offload import io_engine as zio

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


class Checkpoint:
    """One tag directory: its files, its manifest, and loading that names what failed."""

    def __init__(self, directory: str, io: Optional["zio.IoEngine"] = None):
        self.dir = directory
        self.manifest = files.read_manifest(directory)
        self.io = io  # the I/O engine its files stream through (files.io_engine if None)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def load(self, name: str, lazy: bool = False) -> Any:
        return files.load_file(self.path(name), self.manifest, lazy=lazy, engine=self.io)

    def optim_file(self, dp_rank: int, bf16: bool) -> str:
        for name in layout.optim_states_candidates(dp_rank, bf16):
            if os.path.isfile(self.path(name)):
                return name
        raise FileNotFoundError(
            f"checkpoint {self.dir} has no optimizer state for data-parallel rank {dp_rank} "
            f"(looked for {layout.optim_states_name(dp_rank, bf16)}); the save did not "
            f"complete on that rank, or the files were moved"
        )


def _module_shapes(engine: "ZeroEngine") -> Dict[str, torch.Size]:
    return {n: layout.full_shape(p) for n, p in engine.module.named_parameters()}


def check_model(ckpt: Checkpoint, name: str, sd: dict, engine: "ZeroEngine") -> None:
    """Raises naming the parameter when the checkpoint's shapes differ from the model's."""
    saved: Dict[str, torch.Size] = {}
    for shapes in sd.get("param_shapes") or []:
        saved.update(shapes)
    saved.update(sd.get("frozen_param_shapes") or {})
    if not saved:  # stage 0: the module state holds whole tensors
        params = dict(engine.module.named_parameters())
        saved = {k: v.shape for k, v in sd["module"].items() if k in params}
    ours = _module_shapes(engine)
    for pname, shape in saved.items():
        if pname in ours and torch.Size(shape) != ours[pname]:
            raise ValueError(
                f"checkpoint {ckpt.path(name)} is from a different model: parameter "
                f"{pname!r} has shape {tuple(shape)} there and {tuple(ours[pname])} here"
            )


def _load_module(engine: "ZeroEngine", sd: dict, strict: bool, custom_load_fn) -> None:
    """Stages 0-2: the whole weights from the model-states file. Its large tensors are
    FileTensors read straight into the module's own (stream.py), so the weights are never
    in memory twice; the rest goes through load_state_dict."""
    saved = sd["module"]
    if custom_load_fn is not None:
        custom_load_fn(src=stream.materialize(saved), dst=engine.module)
        return
    module = engine.module
    own = module.state_dict(keep_vars=True)
    lazy = {k: v for k, v in saved.items() if isinstance(v, stream.FileTensor) and k in own}
    for key, src in lazy.items():
        dst = own[key]
        if tuple(src.shape) != tuple(dst.shape):
            raise RuntimeError(
                f"load_checkpoint: {key!r} has shape {tuple(src.shape)} in the checkpoint and "
                f"{tuple(dst.shape)} in the model"
            )
        with torch.no_grad():
            stream.copy_into(dst.data, src)
    # Large tensors the model has no place for are reported, never read.
    unread = [k for k, v in saved.items() if isinstance(v, stream.FileTensor) and k not in own]
    rest = {k: v for k, v in saved.items() if k not in lazy and k not in unread}
    result = module.load_state_dict(stream.materialize(rest), strict=False)
    unexpected = list(result.unexpected_keys) + unread
    missing = [k for k in result.missing_keys if k not in lazy]
    if strict and (missing or unexpected):
        raise RuntimeError(
            f"load_checkpoint: the checkpoint's module state does not match the model "
            f"(missing keys {missing}, unexpected keys {unexpected}); pass "
            f"load_module_strict=False to load what matches"
        )


def _load_module_from_stage3(
    engine: "ZeroEngine", ckpt: Checkpoint, sd: dict, strict: bool, custom_load_fn, with_optim
) -> None:
    """Stages 0-2 from a stage-3 checkpoint: the buffers from the model file; the weights
    consolidated from every rank's fp32 partitions (cast to the module's dtype by
    load_state_dict), or, when the optimizer state is loaded next (it writes the trained
    weights), the frozen ones only: the optimizer files are then read once."""
    saved = sd["module"]
    buffers = {n: saved[n] for n in sd.get("buffer_names", []) if n in saved}
    if with_optim and custom_load_fn is None:
        saved_world = int(sd.get("dp_world_size", engine.dp_world_size))
        frozen = {**reshard.frozen_fp32(ckpt, saved_world), **buffers}
        _load_module(engine, {"module": frozen}, strict=False, custom_load_fn=None)
        return
    full = {**reshard.consolidated_fp32(ckpt.dir), **buffers}
    _load_module(engine, {"module": full}, strict, custom_load_fn)


def _load_stage3_buffers(engine: "ZeroEngine", sd: dict, strict: bool) -> None:
    buffers = {n: b for n, b in engine.module.named_buffers()}
    saved = sd["module"]
    for name in sd.get("buffer_names", []):
        if name in buffers and name in saved:
            with torch.no_grad():
                buffers[name].copy_(saved[name])
    if strict:
        expected, got = set(engine.module.state_dict().keys()), set(saved)
        missing, unexpected = sorted(expected - got), sorted(got - expected)
        if missing or unexpected:
            raise RuntimeError(
                f"load_checkpoint: the checkpoint's module state does not match the model "
                f"(missing keys {missing}, unexpected keys {unexpected}); pass "
                f"load_module_strict=False to load what matches"
            )


def _write_stage3_params(
    engine: "ZeroEngine", full: Dict[str, torch.Tensor], every: bool = True
) -> None:
    """The shards of the params in `full` (whole fp32 values); with `every`, a param it
    lacks is reported. Persistent params are re-gathered by _publish."""
    missing = []
    for name, p in engine.module.named_parameters():
        zp = zero_param_of(p)
        if name not in full:
            missing.append(name)
            continue
        value = full[name].reshape(-1)
        if zp is None:
            with torch.no_grad():
                p.copy_(value.view_as(p))
        else:
            zp.partitioner.write_shard(zp, value.to(device=zp.device, dtype=zp.dtype))
    if missing and every:
        logger.warning("load_checkpoint: no saved values for %s; they keep their weights", missing)


def _load_stage3_module(
    engine: "ZeroEngine",
    ckpt: Checkpoint,
    sd: dict,
    strict: bool,
    custom_load_fn,
    with_optim: bool,
    saved_stage: int,
) -> None:
    """Stage 3: buffers from the model file; trained params from the optimizer partitions
    when those are loaded next (else from the consolidated fp32 weights); frozen params
    from this rank's file, or re-cut from every rank's when the world size changed, or
    (a stage 1/2 checkpoint) from its whole weights."""
    _load_stage3_buffers(engine, sd, strict)
    saved_world = int(sd.get("dp_world_size", engine.dp_world_size))
    if custom_load_fn is not None:
        custom_load_fn(src=reshard.consolidated_fp32(ckpt.dir), dst=engine.module)
    elif not with_optim:
        _write_stage3_params(engine, reshard.consolidated_fp32(ckpt.dir))
    elif saved_stage < 3:  # the frozen ones from its whole weights (the optimizer's next)
        params = dict(engine.module.named_parameters())
        trained = {n for group in sd.get("param_shapes") or [] for n in group}
        saved = {n: v for n, v in sd["module"].items() if n in params and n not in trained}
        _write_stage3_params(engine, saved, every=False)
    elif saved_world == engine.dp_world_size:
        _load_stage3_frozen(engine, sd)
    else:
        _write_stage3_params(engine, reshard.frozen_fp32(ckpt, saved_world), every=False)


def _load_stage3_frozen(engine: "ZeroEngine", sd: dict) -> None:
    """This rank's shards of the frozen params (same world size: its own file's)."""
    params = dict(engine.module.named_parameters())
    for name, fragment in (sd.get("frozen_param_fragments") or {}).items():
        zp = zero_param_of(params[name]) if name in params else None
        if zp is None:
            continue
        values = fragment.reshape(-1)
        with torch.no_grad():
            if zp.shard is None:
                zp.partitioner.swapper.write(zp, values.to(zp.dtype))
            else:
                zp.shard.copy_(values)
        zp.partitioner.shard_modified(zp)


def _zero_state(
    ckpt: Checkpoint, sd: dict, engine: "ZeroEngine", dp_rank: int, saved_world: int
) -> dict:
    """This rank's ZeRO optimizer state: its own file when the checkpoint's partitions are
    cut as this run cuts them (same world size and layout), else re-cut by parameter name
    from every rank's file (reshard.py). DeepSpeed's files are mapped by migrate.py."""
    if saved_world == engine.dp_world_size:
        name = ckpt.optim_file(dp_rank, engine.bfloat16_enabled())
        where = ckpt.path(name)
        # lazy: the optimizer streams its large tensors from the file into their places.
        state = migrate.zero_state(
            ckpt.load(name, lazy=True)["optimizer_state_dict"], engine, where
        )
        if migrate.same_layout(sd, state, engine, saved_world):
            return migrate.with_param_groups(state, engine, where)
    return reshard.optimizer_state(ckpt, sd, engine, saved_world)


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
    engine: "ZeroEngine",
    load_dir: str,
    tag: Optional[str] = None,
    load_module_strict: bool = True,
    load_optimizer_states: bool = True,
    load_lr_scheduler_states: bool = True,
    load_module_only: bool = False,
    custom_load_fn: Optional[Callable] = None,
) -> Tuple[Optional[str], Optional[dict]]:
    """(path of the model-states file, client_state), or (None, None) when there is
    nothing to load. All ranks must call it; see Note [A load that fails part way]."""
    if engine._config.checkpoint.load_universal:  # every rank refuses: one config
        raise NotImplementedError(
            f"load_checkpoint({load_dir!r}): checkpoint.load_universal is true, and zerostream "
            f"does not read DeepSpeed's universal layout (ds_to_universal's "
            f"zero/<param>/*.pt folders). It loads the regular checkpoint that one was made "
            f"from at any data-parallel world size and ZeRO stage (the optimizer state is "
            f"re-cut by parameter name): set checkpoint.load_universal to false and pass that "
            f"checkpoint's folder, the one holding `latest` and global_step<N>/."
        )
    if tag is None:
        tag = _latest_tag(load_dir)
        if tag is None:
            return None, None
    where = os.path.join(load_dir, str(tag))
    touched: List[bool] = [False]
    error: Optional[BaseException] = None
    result: Tuple[Optional[str], Optional[dict]] = (None, None)
    try:
        result = _load_local(
            engine,
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
    outcomes = _outcomes(engine, error is not None, touched[0])
    failed = [r for r, (bad, _) in enumerate(outcomes) if bad]
    if failed:
        if any(changed for _, changed in outcomes):
            engine._incomplete_load = (
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
        _publish(engine, load_optimizer_states and not load_module_only)
    engine._incomplete_load = None
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
#   succeeds (engine._incomplete_load), so a half-loaded model never trains or is saved;
# - else the collective half gathers the loaded partitions into every rank's weights.
# A failure before anything was overwritten (no checkpoint, another model's shapes, a
# damaged header) leaves the engine as it was and usable.


def _outcomes(engine: "ZeroEngine", failed: bool, touched: bool) -> List[Tuple[bool, bool]]:
    """(failed, touched) of every rank."""
    if engine.world_size == 1:
        return [(failed, touched)]
    outcomes: List[Any] = [None] * engine.world_size
    comm.all_gather_object(outcomes, (failed, touched))
    return [tuple(o) for o in outcomes]


def _publish(engine: "ZeroEngine", with_optimizer: bool) -> None:
    """The collective half: every rank's weights from the partitions it loaded."""
    if engine.zero_optimization_stage() == 3:  # the weights, with or without an optimizer
        runtime = runtime_of(engine.module)
        if runtime is not None:
            runtime.publish_loaded()
    elif with_optimizer and engine.optimizer is not None:
        engine.optimizer.publish_loaded()


def _model_file(ckpt: Checkpoint, stage: int, dp_rank: int) -> Optional[str]:
    """The model-states file this rank reads: its own layout's, else the other layout's
    (a checkpoint saved at another stage, or a stage-3 one saved by fewer ranks)."""
    names = [layout.model_states_name(stage, dp_rank), layout.model_states_name(3, 0)]
    if stage == 3:
        names.append(layout.model_states_name(0, 0))
    for name in names:
        if os.path.isfile(ckpt.path(name)):
            return name
    return None


def _saved_stage(name: str, sd: dict) -> int:
    """3 for per-rank model files, 1 (for 1 or 2) when the file lists the optimizer's
    parameter groups, else 0 (reference §3.2: stage 0 writes no param_shapes)."""
    if name != layout.model_states_name(0, 0):
        return 3
    return 1 if sd.get("param_shapes") else 0


def _load_local(
    engine: "ZeroEngine",
    tag_dir: str,
    touched: List[bool],
    strict: bool,
    want_optimizer: bool,
    load_lr_scheduler_states: bool,
    load_module_only: bool,
    custom_load_fn: Optional[Callable],
) -> Tuple[Optional[str], Optional[dict]]:
    """This rank's half of load_checkpoint: no collective. touched[0] turns True just
    before the first write into the engine's state."""
    ckpt = Checkpoint(tag_dir, files.io_engine_for(engine))
    stage = engine.zero_optimization_stage()
    dp_rank = comm.get_rank(engine.dp_process_group)
    model_name = _model_file(ckpt, stage, dp_rank)
    if model_name is None:  # DeepSpeed's answer too: a warning and (None, None)
        logger.warning(
            "load_checkpoint: %s has no model-states file (%s); nothing was loaded",
            ckpt.dir,
            layout.model_states_name(stage, dp_rank),
        )
        return None, None
    # lazy: a stage 0-2 module's weights are read straight into it (_load_module).
    sd = ckpt.load(model_name, lazy=stage < 3)
    sd = {k: v if k == "module" else stream.materialize(v) for k, v in sd.items()}
    check_model(ckpt, model_name, sd, engine)
    saved_world = int(sd.get("dp_world_size", engine.dp_world_size))
    saved_stage = _saved_stage(model_name, sd)
    opt = engine.optimizer
    want_optimizer = want_optimizer and opt is not None
    if want_optimizer and (saved_stage == 0) != (stage == 0):
        raise ValueError(
            f"load_checkpoint: {ckpt.dir} was saved at ZeRO stage "
            f"{'0' if saved_stage == 0 else '1-3'} and this run is stage {stage}; optimizer "
            f"state moves between stages 1, 2 and 3 only. Pass load_optimizer_states=False "
            f"to load the weights alone (nothing was loaded)"
        )
    lr_unsaved = False

    touched[0] = True
    if stage < 3 and saved_stage == 3:
        _load_module_from_stage3(engine, ckpt, sd, strict, custom_load_fn, want_optimizer)
    elif stage < 3:
        _load_module(engine, sd, strict, custom_load_fn)
    else:
        _load_stage3_module(engine, ckpt, sd, strict, custom_load_fn, want_optimizer, saved_stage)

    if want_optimizer:
        if stage == 0:
            if sd.get("optimizer") is not None:
                path = ckpt.path(model_name)
                opt.load_state_dict(migrate.stage0_state(sd["optimizer"], engine, path))
        else:
            state = _zero_state(ckpt, sd, engine, dp_rank, saved_world)
            opt.load_state_dict(state, publish=False)
            lr_unsaved = bool(state.get(migrate.NO_HYPERPARAMETERS))
    elif opt is not None and stage < 3:
        # fp32 masters from the weights just loaded, as DeepSpeed does (at stage 3 the
        # partitioner's shard writes already told the optimizer).
        opt.refresh_masters()

    deepspeed_states = {"module"}
    if not load_module_only:
        if (
            load_lr_scheduler_states
            and engine.lr_scheduler is not None
            and sd.get("lr_scheduler") is not None
        ):
            engine.lr_scheduler.load_state_dict(sd["lr_scheduler"])
            if lr_unsaved:
                migrate.lr_from_scheduler(engine.lr_scheduler)
        engine.global_steps = int(sd.get("global_steps", 0))
        engine.global_samples = int(
            sd.get("global_samples", engine.global_steps * engine.train_batch_size())
        )
        engine.skipped_steps = int(sd.get("skipped_steps", 0))
        deepspeed_states = ENGINE_KEYS
    client_state = {k: v for k, v in sd.items() if k not in deepspeed_states}
    return ckpt.path(model_name), client_state

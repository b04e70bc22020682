"""engine.save_checkpoint: DeepSpeed's layout (layout.py), written crash-safely (files.py,
Note [Crash-safe checkpoints]).

Which rank writes what: stages 0-2 keep whole weights on every rank, so DP rank 0 alone
writes `mp_rank_00_model_states.pt`; at stage 3 every rank writes its own model-states file
(its shards of frozen params). With ZeRO (stages 1-3) every rank writes its optimizer
partition to `[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt`; at stage 0 the optimizer
state rides in the model-states file, as in DeepSpeed. Tensors are saved on the CPU, so a
checkpoint from GPU ranks loads on CPU ranks and the reverse.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch

from .. import comm
from ..zero.stage3.param import zero_param_of
from . import files, layout, stream

if TYPE_CHECKING:
    from ..engine import ZeroEngine

logger = logging.getLogger("zerostream")

RESERVED_CLIENT_KEYS = ("checkpoint_parallel_dimensions",)


def _cpu(value: Any) -> Any:
    """`value` with every tensor detached onto the CPU (plain containers kept). A view of a
    larger storage (a partition inside the host arena or a flat buffer) is copied out:
    torch.save writes a tensor's whole storage. The streamed writer (stream.py) needs none
    of that: it writes views and device tensors as they are, each as its own storage, so
    nothing is copied whole into host memory."""
    if stream.AVAILABLE:
        return value
    if torch.is_tensor(value):
        t = value.detach()
        if t.device.type != "cpu" or t.untyped_storage().nbytes() != t.numel() * t.element_size():
            return t.to("cpu", copy=True).contiguous()
        return t
    if isinstance(value, dict):
        return type(value)((k, _cpu(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return type(value)(_cpu(v) for v in value)
    return value


def _frozen_state(engine: "ZeroEngine", groups: List[List[torch.nn.Parameter]]):
    """frozen_param_shapes and frozen_param_fragments: the whole value of each parameter
    no optimizer trains (stage 3: this rank's shard of it)."""
    shapes, fragments = {}, {}
    for name, p in layout.frozen_params(engine.module, groups):
        shapes[name] = layout.full_shape(p)
        zp = zero_param_of(p)
        if zp is None:
            fragments[name] = _cpu(p.detach())
        elif zp.shard is None:  # offload_param nvme: the shard is read back from disk
            fragments[name] = zp.partitioner.swapper.read(zp)
        else:
            fragments[name] = _cpu(zp.shard.detach())
    return shapes, fragments


def model_states(
    engine: "ZeroEngine", client_state: dict, exclude_frozen_parameters: bool
) -> Dict[str, Any]:
    """The `*_model_states.pt` dict (reference §3.2)."""
    stage = engine.zero_optimization_stage()
    opt = engine.optimizer
    module_state = engine.module.state_dict()
    buffers = layout.buffer_names(engine.module, module_state.keys())
    if exclude_frozen_parameters:
        frozen = {n for n, p in engine.module.named_parameters() if not p.requires_grad}
        module_state = type(module_state)(
            (k, v) for k, v in module_state.items() if k not in frozen
        )
    state: Dict[str, Any] = {
        "module": _cpu(module_state),
        "buffer_names": buffers,
        "optimizer": _cpu(opt.state_dict()) if stage == 0 and opt is not None else None,
        "shared_params": layout.shared_params(engine.module),
        "lr_scheduler": (
            _cpu(engine.lr_scheduler.state_dict())
            if engine.lr_scheduler is not None and hasattr(engine.lr_scheduler, "state_dict")
            else None
        ),
        "data_sampler": None,
        "random_ltd": None,
        "sparse_tensor_module_names": [],
        "skipped_steps": engine.skipped_steps,
        "global_steps": engine.global_steps,
        "global_samples": engine.global_samples,
        "dp_world_size": engine.dp_world_size,
        "mp_world_size": engine.mp_world_size,
        "checkpoint_parallel_dimensions": {"pp_degree": 1, "tp_degree": 1},
        "ds_config": engine.config,
        "ds_version": layout.DS_LAYOUT_VERSION,
    }
    if stage > 0 and opt is not None:
        groups = opt.bit16_groups
        state["param_shapes"] = layout.param_shapes(engine.module, groups)
        if not exclude_frozen_parameters:
            shapes, fragments = _frozen_state(engine, groups)
            state["frozen_param_shapes"] = shapes
            state["frozen_param_fragments"] = fragments
    state.update(client_state)
    return state


def _check_client_state(client_state: Optional[dict]) -> dict:
    client_state = {} if client_state is None else client_state
    if not isinstance(client_state, dict):
        raise TypeError(
            f"save_checkpoint: client_state must be a dict; got {type(client_state).__name__}"
        )
    for key in RESERVED_CLIENT_KEYS:
        if key in client_state:
            raise KeyError(f"save_checkpoint: client_state key {key!r} is reserved")
    return client_state


def _check_node_local_storage(engine: "ZeroEngine", save_dir: str) -> None:
    """checkpoint.use_node_local_storage (HF's save_on_each_node): every host writes its own
    copy to a folder only it sees. On one host that is what is done anyway; across hosts
    zerostream writes one checkpoint to a folder every rank reaches (rank 0 commits it), so
    it refuses up front instead of failing part way on the other hosts. Every rank
    decides the same: the launcher's per-host rank count is below the world size on all
    hosts or on none."""
    from ..ops.threads import local_ranks

    if not engine._config.checkpoint.use_node_local_storage:
        return
    here, told_by = local_ranks()
    if told_by and here < engine.world_size:
        raise NotImplementedError(
            f"save_checkpoint({save_dir!r}): checkpoint.use_node_local_storage is true and "
            f"this run spans several hosts ({engine.world_size} ranks, {here} on this one by "
            f"{told_by}). zerostream writes one checkpoint, committed by rank 0, to a folder "
            f"every rank can reach: put save_dir on a filesystem all hosts share and set "
            f"checkpoint.use_node_local_storage to false (HF: save_on_each_node)."
        )


def _validate_tag(engine: "ZeroEngine", tag: str) -> None:
    """checkpoint.tag_validation: every rank must save under the same tag."""
    mode = engine._config.checkpoint.tag_validation.lower()
    if mode == "ignore" or engine.world_size == 1:
        return
    tags: List[Optional[str]] = [None] * engine.world_size
    comm.all_gather_object(tags, tag)
    if len(set(tags)) == 1:
        return
    detail = ", ".join(f"rank {r}: {t!r}" for r, t in enumerate(tags))
    message = f"save_checkpoint: ranks disagree on the checkpoint tag ({detail})"
    if mode == "fail":
        raise ValueError(message + "; checkpoint.tag_validation is Fail")
    logger.warning("%s", message)


def _all_ok(engine: "ZeroEngine", error: Optional[BaseException]) -> List[int]:
    """Ranks that failed to write (every rank learns it, so none commits alone)."""
    if engine.world_size == 1:
        return [0] if error is not None else []
    flags: List[Optional[bool]] = [None] * engine.world_size
    comm.all_gather_object(flags, error is not None)
    return [r for r, failed in enumerate(flags) if failed]


def save_checkpoint(
    engine: "ZeroEngine",
    save_dir: str,
    tag: Optional[str] = None,
    client_state: Optional[dict] = None,
    save_latest: bool = True,
    exclude_frozen_parameters: bool = False,
) -> bool:
    """See the module docstring. All ranks must call it; returns True."""
    client_state = _check_client_state(client_state)
    tag = layout.check_tag(layout.default_tag(engine.global_steps) if tag is None else tag)
    _check_node_local_storage(engine, save_dir)
    _validate_tag(engine, tag)
    stage = engine.zero_optimization_stage()
    rank, dp_rank = engine.global_rank, comm.get_rank(engine.dp_process_group)
    staging = files.staging_dir(save_dir, tag)
    if rank == 0:
        os.makedirs(save_dir, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)  # a crashed save's leftovers
        os.makedirs(staging)
    comm.barrier()

    written: Dict[str, Dict[str, int]] = {}
    error: Optional[BaseException] = None
    io = files.io_engine_for(engine)
    try:
        files.kill_point("before_model_states")
        if stage == 3 or dp_rank == 0:
            name = layout.model_states_name(stage, dp_rank)
            written[name] = files.save_file(
                model_states(engine, client_state, exclude_frozen_parameters),
                os.path.join(staging, name),
                io,
            )
        files.kill_point("before_optim_states")
        if stage > 0 and engine.optimizer is not None:
            name = layout.optim_states_name(dp_rank, engine.bfloat16_enabled())
            optim = {
                "optimizer_state_dict": _cpu(
                    engine.optimizer.state_dict(streamed=stream.AVAILABLE)
                ),
                "ds_config": engine.config,
                "ds_version": layout.DS_LAYOUT_VERSION,
            }
            files.kill_point("during_optim_states")
            written[name] = files.save_file(optim, os.path.join(staging, name), io)
        files.kill_point("after_optim_states")
    except BaseException as exc:  # every rank must hear of it before anyone commits
        error = exc
    failed = _all_ok(engine, error)
    if failed:
        if error is not None:
            raise error
        raise RuntimeError(
            f"save_checkpoint: rank(s) {failed} could not write their part of "
            f"{os.path.join(save_dir, tag)}; nothing was committed and the previous "
            f"checkpoint is untouched"
        )
    manifests: List[Optional[dict]] = [written]
    if engine.world_size > 1:
        manifests = [None] * engine.world_size
        comm.all_gather_object(manifests, written)
    error = None
    if rank == 0:
        try:
            entries = {k: v for m in manifests for k, v in m.items()}
            files.write_manifest(staging, entries)
            _copy_recovery_script(save_dir)
            files.kill_point("before_commit")
            files.commit_dir(staging, os.path.join(save_dir, tag))
            files.kill_point("before_latest")
            if save_latest:
                files.save_text(tag, os.path.join(save_dir, files.LATEST))
        except BaseException as exc:
            error = exc
    if _all_ok(engine, error):
        if error is not None:
            raise error
        raise RuntimeError(
            f"save_checkpoint: rank 0 could not commit {os.path.join(save_dir, tag)}; "
            f"the previous checkpoint is untouched"
        )
    return True


def _copy_recovery_script(save_dir: str) -> None:
    """zero_to_fp32.py next to the tags, as DeepSpeed leaves it: it needs only torch."""
    from . import zero_to_fp32

    target = os.path.join(save_dir, "zero_to_fp32.py")
    shutil.copyfile(zero_to_fp32.__file__, target + ".partial")
    os.chmod(target + ".partial", 0o755)
    os.replace(target + ".partial", target)

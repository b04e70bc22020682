"""engine.save_checkpoint: DeepSpeed's layout (layout.py), written crash-safely (files.py,
Note [Crash-safe checkpoints]).

Which rank writes what follows from what the stage says of itself (Note [Stage checkpoints]
in zero/protocol.py): with whole weights on every rank (stages 0-2) DP rank 0 alone writes
`mp_rank_00_model_states.pt`; with sharded weights (stage 3) every rank writes its own
model-states file (its shards of frozen params). With a partitioned optimizer (stages 1-3)
every rank writes its partition to `[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt`;
else (stage 0) the optimizer state rides in the model-states file, as in DeepSpeed.
Tensors are saved on the CPU, so a checkpoint from GPU ranks loads on CPU ranks and the
reverse.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from typing import Any, Dict, List, Optional

import torch

from .. import comm
from . import files, layout, stream, writer_lock
from .target import CheckpointTarget
from .tree import map_leaves

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

    def own(t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if t.device.type != "cpu" or t.untyped_storage().nbytes() != t.numel() * t.element_size():
            return t.to("cpu", copy=True).contiguous()
        return t

    return map_leaves(value, own)


def model_states(
    target: CheckpointTarget, client_state: dict, exclude_frozen_parameters: bool, part
) -> Dict[str, Any]:
    """The `*_model_states.pt` dict (reference §3.2); `part`: the stage's PartitionLayout
    (None without an optimizer)."""
    module, stage, counters = target.module, target.stage, target.counters
    module_state = module.state_dict()
    buffers = layout.buffer_names(module, module_state.keys())
    if exclude_frozen_parameters:
        frozen = {n for n, p in module.named_parameters() if not p.requires_grad}
        module_state = type(module_state)(
            (k, v) for k, v in module_state.items() if k not in frozen
        )
    whole_optimizer = part is not None and not part.partitioned
    scheduler = target.lr_scheduler
    state: Dict[str, Any] = {
        "module": _cpu(module_state),
        "buffer_names": buffers,
        "optimizer": _cpu(stage.save_partition_state()) if whole_optimizer else None,
        "shared_params": layout.shared_params(module),
        "lr_scheduler": (
            _cpu(scheduler.state_dict())
            if scheduler is not None and hasattr(scheduler, "state_dict")
            else None
        ),
        "data_sampler": None,
        "random_ltd": None,
        "sparse_tensor_module_names": [],
        "skipped_steps": counters.skipped_steps,
        "global_steps": counters.global_steps,
        "global_samples": counters.global_samples,
        "dp_world_size": target.dp_world_size,
        "mp_world_size": target.mp_world_size,
        "checkpoint_parallel_dimensions": {"pp_degree": 1, "tp_degree": 1},
        "ds_config": target.ds_config,
        "ds_version": layout.DS_LAYOUT_VERSION,
    }
    if part is not None and part.partitioned:
        state["param_shapes"] = layout.param_shapes(module, part.groups)
        if not exclude_frozen_parameters:
            # The whole value of each parameter no optimizer trains (sharded: this rank's
            # shard of it).
            named = layout.frozen_params(module, part.groups)
            values = stage.frozen_values(named)
            state["frozen_param_shapes"] = {name: layout.full_shape(p) for name, p in named}
            state["frozen_param_fragments"] = {name: _cpu(values[name]) for name, _ in named}
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


def _check_node_local_storage(target: CheckpointTarget, save_dir: str) -> None:
    """checkpoint.use_node_local_storage (HF's save_on_each_node): every host writes its own
    copy to a folder only it sees. On one host that is what is done anyway; across hosts
    zerostream writes one checkpoint to a folder every rank reaches (rank 0 commits it), so
    it refuses up front instead of failing part way on the other hosts. Every rank
    decides the same: the launcher's per-host rank count is below the world size on all
    hosts or on none."""
    from ..comm import local_ranks

    if not target.checkpoint.use_node_local_storage:
        return
    here, told_by = local_ranks()
    if told_by and here < target.world_size:
        raise NotImplementedError(
            f"save_checkpoint({save_dir!r}): checkpoint.use_node_local_storage is true and "
            f"this run spans several hosts ({target.world_size} ranks, {here} on this one by "
            f"{told_by}). zerostream writes one checkpoint, committed by rank 0, to a folder "
            f"every rank can reach: put save_dir on a filesystem all hosts share and set "
            f"checkpoint.use_node_local_storage to false (HF: save_on_each_node)."
        )


class TagMismatchError(ValueError, AssertionError):
    """Ranks saved under different tags with tag_validation Fail (an AssertionError too, as
    DeepSpeed asserts it). Raised on every rank before anything is written."""


def _validate_tag(target: CheckpointTarget, tag: str) -> None:
    """checkpoint.tag_validation: every rank must save under the same tag."""
    mode = target.checkpoint.tag_validation.lower()
    if mode == "ignore" or target.world_size == 1:
        return
    tags: List[Optional[str]] = [None] * target.world_size
    comm.all_gather_object(tags, tag)
    if len(set(tags)) == 1:
        return
    detail = ", ".join(f"rank {r}: {t!r}" for r, t in enumerate(tags))
    message = f"save_checkpoint: ranks disagree on the checkpoint tag ({detail})"
    if mode == "fail":
        raise TagMismatchError(message + "; checkpoint.tag_validation is Fail")
    logger.warning("%s", message)


def _all_ok(target: CheckpointTarget, error: Optional[BaseException]) -> List[int]:
    """Ranks that failed to write (every rank learns it, so none commits alone)."""
    if target.world_size == 1:
        return [0] if error is not None else []
    flags: List[Optional[bool]] = [None] * target.world_size
    comm.all_gather_object(flags, error is not None)
    return [r for r, failed in enumerate(flags) if failed]


def save_checkpoint(
    target: CheckpointTarget,
    save_dir: str,
    tag: Optional[str] = None,
    client_state: Optional[dict] = None,
    save_latest: bool = True,
    exclude_frozen_parameters: bool = False,
) -> bool:
    """See the module docstring. All ranks must call it; returns True."""
    # Every rank gets the same arguments, so each refuses them alone without a collective.
    if not isinstance(save_dir, (str, os.PathLike)) or not os.fspath(save_dir):
        raise ValueError(f"save_checkpoint: save_dir must be a non-empty path, got {save_dir!r}")
    save_dir = os.fspath(save_dir)
    client_state = _check_client_state(client_state)
    steps = target.counters.global_steps
    tag = layout.check_tag(layout.default_tag(steps) if tag is None else tag)
    _check_node_local_storage(target, save_dir)
    _validate_tag(target, tag)
    stage = target.stage
    rank, dp_rank = target.global_rank, target.dp_rank
    staging = files.staging_dir(save_dir, tag)
    error: Optional[BaseException] = None
    if rank == 0:
        try:
            os.makedirs(save_dir, exist_ok=True)
            writer_lock.claim(save_dir)  # Note [Checkpoint folder ownership]
            shutil.rmtree(staging, ignore_errors=True)  # a crashed save's leftovers
            os.makedirs(staging)
        except OSError as exc:  # the others would wait for rank 0 forever: tell them
            error = exc
    if _all_ok(target, error):
        if error is not None and error.errno == errno.EBUSY:
            raise error
        if error is not None:
            raise OSError(
                error.errno,
                f"save_checkpoint: cannot create the checkpoint folder {save_dir}: "
                f"{error.strerror}",
                error.filename,
            ) from error
        raise RuntimeError(
            f"save_checkpoint: rank 0 could not create the checkpoint folder {save_dir} or "
            "another live job writes it (rank 0's error says which); nothing was written"
        )

    written: Dict[str, Dict[str, int]] = {}
    io = files.io_engine_for(target)
    try:
        part = stage.partition_layout()
        files.kill_point("before_model_states")
        if stage.sharded_weights or dp_rank == 0:
            name = layout.model_states_name(dp_rank, stage.sharded_weights)
            written[name] = files.save_file(
                model_states(target, client_state, exclude_frozen_parameters, part),
                os.path.join(staging, name),
                io,
            )
        files.kill_point("before_optim_states")
        if part is not None and part.partitioned:
            name = layout.optim_states_name(dp_rank, target.bf16)
            optim = {
                "optimizer_state_dict": _cpu(stage.save_partition_state(streamed=stream.AVAILABLE)),
                "ds_config": target.ds_config,
                "ds_version": layout.DS_LAYOUT_VERSION,
            }
            files.kill_point("during_optim_states")
            written[name] = files.save_file(optim, os.path.join(staging, name), io)
        files.kill_point("after_optim_states")
    except BaseException as exc:  # every rank must hear of it before anyone commits
        error = exc
    failed = _all_ok(target, error)
    if failed:
        if error is not None:
            raise error
        raise RuntimeError(
            f"save_checkpoint: rank(s) {failed} could not write their part of "
            f"{os.path.join(save_dir, tag)}; nothing was committed and the previous "
            f"checkpoint is untouched"
        )
    manifests: List[Optional[dict]] = [written]
    if target.world_size > 1:
        manifests = [None] * target.world_size
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
    if _all_ok(target, error):
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

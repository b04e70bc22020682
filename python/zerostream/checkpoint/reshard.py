"""Loading a ZeRO checkpoint into a different data-parallel world size (N saved, M now).

The optimizer state of every kind (fp32 master, exp_avg, exp_avg_sq) is elementwise over the
same flatten order whatever the world size, so resharding is re-cutting: put the N saved
partitions of a group back into whole-group order, then take the elements this rank owns
under M. The two layouts differ by stage (reference §3.3):
  stages 1/2: a group is one flat vector padded to a multiple of 2*world and cut into world
    equal partitions (zero/flat.py); the saved fp32 partitions have the padding removed,
    the saved moments keep it;
  stage 3: a group's partition is its params' shards, ceil(numel/world) each, concatenated.
Scalars (the step count, hyperparameters, the loss scaler) come from rank 0's file.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict, List

import torch

from .. import _C
from . import files, layout
from .zero_to_fp32 import fp32_state_dict_of_dir, merge_frozen

if TYPE_CHECKING:
    from ..engine import ZeroEngine
    from .load import Checkpoint

_MOMENTS = ("exp_avg", "exp_avg_sq")


def consolidated_fp32(ds_dir: str) -> Dict[str, torch.Tensor]:
    """Whole fp32 weights of a tag folder, every file checked against its manifest."""
    manifest = files.read_manifest(ds_dir)
    return fp32_state_dict_of_dir(ds_dir, load=lambda path: files.load_file(path, manifest))


def frozen_fp32(ckpt: "Checkpoint", saved_world: int) -> Dict[str, torch.Tensor]:
    """Whole values of the frozen params of a stage-3 checkpoint (every rank's model file
    holds its shard of them); the optimizer files are not read."""
    models = [ckpt.load(layout.model_states_name(3, r)) for r in range(saved_world)]
    out: Dict[str, torch.Tensor] = {}
    merge_frozen(out, models, 3, saved_world)
    return out


# --- whole-group vectors from N saved partitions -----------------------------------------------
def _stage12_whole(parts: List[torch.Tensor], numel: int, world: int) -> torch.Tensor:
    """The group's `numel` elements from N partitions (padded or not)."""
    out = torch.empty(numel, dtype=torch.float32)
    for r, part in enumerate(parts):
        begin, _, valid = _C.stage12_partition(numel, world, r)
        out[begin : begin + valid].copy_(part.reshape(-1)[:valid])
    return out


def _stage12_cut(whole: torch.Tensor, world: int, rank: int) -> torch.Tensor:
    begin, size, valid = _C.stage12_partition(whole.numel(), world, rank)
    out = torch.zeros(size, dtype=torch.float32)
    out[:valid].copy_(whole[begin : begin + valid])
    return out


def _stage3_whole(parts: List[torch.Tensor], numels: List[int], world: int) -> List[torch.Tensor]:
    """Each param's whole flat value from N concatenated-shard partitions."""
    out, offset = [], 0
    for n in numels:
        shard = math.ceil(n / world)
        pieces = [p.reshape(-1).narrow(0, offset, shard) for p in parts]
        out.append(torch.cat(pieces)[:n].float())
        offset += shard
    return out


def _stage3_cut(params: List[torch.Tensor], world: int, rank: int) -> torch.Tensor:
    pieces = []
    for value in params:
        shard = math.ceil(value.numel() / world)
        piece = torch.zeros(shard, dtype=torch.float32)
        lo, hi = rank * shard, min(value.numel(), (rank + 1) * shard)
        if hi > lo:
            piece[: hi - lo].copy_(value[lo:hi])
        pieces.append(piece)
    return torch.cat(pieces) if pieces else torch.empty(0)


def _regroup(
    parts: List[torch.Tensor], numels: List[int], stage: int, old: int, new: int, rank: int
):
    if stage == 3:
        return _stage3_cut(_stage3_whole(parts, numels, old), new, rank)
    return _stage12_cut(_stage12_whole(parts, sum(numels), old), new, rank)


# --- the optimizer state of this rank ----------------------------------------------------------
def optimizer_state(ckpt: "Checkpoint", sd: dict, engine: "ZeroEngine", saved_world: int) -> dict:
    """This rank's optimizer state dict (its stage's layout) cut from a checkpoint written
    by `saved_world` ranks."""
    stage = engine.zero_optimization_stage()
    bf16 = engine.bfloat16_enabled()
    states = [
        ckpt.load(ckpt.optim_file(r, bf16))["optimizer_state_dict"] for r in range(saved_world)
    ]
    saved_stage = int(states[0]["zero_stage"])
    if saved_stage != stage and not (saved_stage in (1, 2) and stage in (1, 2)):
        raise ValueError(
            f"checkpoint {ckpt.dir} holds ZeRO stage {saved_stage} optimizer state; this run "
            f"is stage {stage} (stages 1 and 2 share a layout, stage 3 does not)"
        )
    groups = [[torch.Size(s).numel() for s in shapes.values()] for shapes in sd["param_shapes"]]
    new, rank = engine.dp_world_size, engine.optimizer.rank
    masters_key = "fp32_flat_groups" if stage == 3 else "single_partition_of_fp32_groups"
    inner_key = "optimizer_state_dict" if stage == 3 else "base_optimizer_state"
    inners = [s[inner_key] for s in states]
    masters, moments = [], {}
    for g, numels in enumerate(groups):
        masters.append(
            _regroup([s[masters_key][g] for s in states], numels, stage, saved_world, new, rank)
        )
        for kind in _MOMENTS:
            saved = [
                inner["state"].get(inner["param_groups"][g]["params"][0], {}) for inner in inners
            ]
            if all(kind in st for st in saved):
                parts = [st[kind] for st in saved]
                moments.setdefault(g, {})[kind] = _regroup(
                    parts, numels, stage, saved_world, new, rank
                )
    first = inners[0]
    inner = {
        "state": {},
        "param_groups": [dict(pg) for pg in first["param_groups"]],
    }
    for g, pg in enumerate(inner["param_groups"]):
        pg["params"] = [g]
        st = first["state"].get(first["param_groups"][g]["params"][0])
        if st is not None and g in moments:
            inner["state"][g] = {**{k: v for k, v in st.items() if k not in _MOMENTS}, **moments[g]}
    state = {k: v for k, v in states[0].items() if k not in (masters_key, inner_key)}
    state.update({masters_key: masters, inner_key: inner, "zero_stage": stage})
    state["partition_count"] = new if stage == 3 else [new] * len(groups)
    return state


def check_groups(sd: dict, engine: "ZeroEngine") -> None:
    """The saved flatten order must be the model's (same groups, same parameters)."""
    ours = layout.param_shapes(engine.module, engine.optimizer.bit16_groups)
    saved = [list(shapes.keys()) for shapes in sd["param_shapes"]]
    if saved != [list(s.keys()) for s in ours]:
        raise ValueError(
            "load_checkpoint: the checkpoint's optimizer groups hold other parameters (or "
            "another order) than this run's, so its partitions cannot be re-cut"
        )

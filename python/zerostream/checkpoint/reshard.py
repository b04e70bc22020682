"""Re-cutting ZeRO optimizer partitions: a checkpoint of N data-parallel ranks into this run's
M, or one whose flat groups are laid out otherwise than this run's (DeepSpeed's
round_robin_gradients order, parameter_alignment padding, stage-3 sub-groups; migrate.py;
a stage 1/2 checkpoint into a stage-3 run and the reverse).

Every kind of optimizer state (fp32 master, exp_avg, exp_avg_sq, Adagrad's sum) is
elementwise over the flatten order, so re-cutting is: rebuild each parameter's whole value
of each kind from the saved partitions, by name from `param_shapes`, then cut this rank's
partitions of this run's groups from them, as the run's stage cuts them (the pieces of its
PartitionLayout, Note [Stage checkpoints] in zero/protocol.py). The two saved layouts
(reference §3.3):
  stages 1/2: a group is one flat vector padded to a multiple of 2*world and cut into world
    equal partitions (zero/flat.py); the saved fp32 partitions have the padding removed,
    the saved moments keep it;
  stage 3: a group's partition is its params' shards, ceil(numel/world) each, concatenated.
Scalars (the step count, hyperparameters, the loss scaler) come from rank 0's file: for
each of this run's groups, from the saved group holding its first parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch

from ..lazy_tensor import LazyTensor
from . import files, layout, migrate
from .files import Checkpoint
from .slices import ReadPlan, Slice
from .zero_to_fp32 import fp32_state_dict_of_dir, merge_frozen


def consolidated_fp32(ds_dir: str) -> Dict[str, torch.Tensor]:
    """Whole fp32 weights of a tag folder, every file checked against its manifest."""
    manifest = files.read_manifest(ds_dir)
    return fp32_state_dict_of_dir(ds_dir, load=lambda path: files.load_file(path, manifest))


def frozen_fp32(ckpt: Checkpoint, saved_world: int) -> Dict[str, torch.Tensor]:
    """Whole values of the frozen params of a sharded checkpoint (every rank's model file
    holds its shard of them); the optimizer files are not read."""
    models = [ckpt.load(layout.model_states_name(r, sharded=True)) for r in range(saved_world)]
    out: Dict[str, torch.Tensor] = {}
    merge_frozen(out, models, sharded=True, world=saved_world)
    return out


# Note [Streamed re-cut]
# ~~~~~~~~~~~~~~~~~~~~~~
# Every rank's optimizer file is opened lazily (its large tensors stay FileTensors), whole
# values by name are only Slices naming ranges of them (slices.py), and this rank's new
# partitions are planned from those ranges and filled by one ordered, CRC-checked pass over
# each saved tensor it needs. So a re-cut holds this rank's partitions and one 64 MiB
# scratch buffer, not the saved state of every rank, and reads only the tensors it needs.

# --- saved partitions -> whole values by parameter name ----------------------------------------
Values = Dict[str, Dict[str, Slice]]  # name -> kind ("fp32", "exp_avg", ...) -> its elements


def _saved_groups(state: dict, where: str) -> List[Tuple[Dict[str, Slice], dict, dict]]:
    """One rank's saved (sub)groups in flatten order: (elementwise tensors by kind, the inner
    state's other entries such as `step`, the param group's hyperparameters). DeepSpeed's
    stage 3 lists every sub-group of a param group under that group's `params`."""
    stage = state["zero_stage"]
    inner, masters = state[migrate.inner_key(stage)], state[migrate.masters_key(stage)]
    slots = [(pid, pg) for pg in inner["param_groups"] for pid in pg["params"]]
    if len(slots) != len(masters):
        raise ValueError(
            f"checkpoint file {where}: {len(masters)} fp32 partitions but the optimizer "
            f"state lists {len(slots)}"
        )
    out = []
    for (pid, pg), master in zip(slots, masters):
        st = inner["state"].get(pid, {})
        tensors = {"fp32": Slice.of(master)}
        n = tensors["fp32"].numel
        tensors.update({k: Slice.of(v) for k, v in st.items() if _elementwise(v, n)})
        scalars = {k: v for k, v in st.items() if not _elementwise(v, n)}
        out.append((tensors, scalars, pg))
    return out


def _elementwise(value, numel: int) -> bool:
    """A state tensor with one value per element of its partition (Adam's moments; saved
    with the partition's end padding where the fp32 partition was saved without it), cut
    and re-cut with it. Anything else is kept whole: a step count, also one held in a
    tensor smaller than the partition (a client optimizer's `tensor_step` of shape (1,),
    DeepSpeed's checkpoint test)."""
    if not (isinstance(value, LazyTensor) or torch.is_tensor(value)) or value.dim() == 0:
        return False
    return value.numel() >= numel


def _stage12_values(ranks, shapes, paddings, where) -> Values:
    """Stages 1/2 (and DeepSpeed's BF16_Optimizer): a group is one flat vector cut into equal
    consecutive partitions, so the ranks' partitions concatenated are the group (the saved
    fp32 ones lack the end padding, which only shortens the tail). DeepSpeed's
    parameter_alignment leaves `paddings[g][i]` elements after parameter i."""
    values: Values = {}
    for g, group in enumerate(shapes):
        pads = paddings[g] if paddings else [0] * len(group)
        kinds = set().union(*(ranks[r][g][0].keys() for r in range(len(ranks))))
        for kind in kinds:
            parts = [r[g][0].get(kind) for r in ranks]
            if any(p is None for p in parts):
                continue  # a moment some rank never had: it restarts at zero
            whole = Slice.cat(parts)
            offset = 0
            for (name, shape), pad in zip(group.items(), pads):
                n = torch.Size(shape).numel()
                if offset + n > whole.numel:
                    raise ValueError(
                        f"checkpoint {where}: group {g}'s {kind} ends before parameter "
                        f"{name!r}; the files are not one checkpoint"
                    )
                values.setdefault(name, {})[kind] = whole[offset : offset + n]
                offset += n + pad
    return values


def _stage3_values(ranks, shapes, world: int, where) -> Values:
    """Stage 3: each rank's (sub)group partitions are its params' shards, ceil(numel/world)
    each, concatenated in `param_shapes` order (sub-group after sub-group)."""
    names = [(n, torch.Size(s).numel()) for group in shapes for n, s in group.items()]
    kinds = set().union(*(t.keys() for r in ranks for t, _, _ in r))
    values: Values = {name: {} for name, _ in names}
    for kind in kinds:
        flats = []
        for r in ranks:
            pieces = [t.get(kind, Slice.zeros(t["fp32"].numel)) for t, _, _ in r]
            flats.append(Slice.cat(pieces))
        offset = 0
        for name, n in names:
            shard = math.ceil(n / world)
            if offset + shard > flats[0].numel:
                raise ValueError(
                    f"checkpoint {where}: the {kind} partitions end before parameter "
                    f"{name!r}; the files are not one checkpoint"
                )
            values[name][kind] = Slice.cat([f[offset : offset + shard] for f in flats])[:n]
            offset += shard
    return values


# --- whole values -> this rank's partitions ------------------------------------------------------
def _cut(params: List[Slice], numel: int, pieces, plan: ReadPlan) -> torch.Tensor:
    """This rank's fp32 partition of one group from its params' whole values: each piece the
    stage owns, (param, first, end, offset in the partition), planned into place; zeros in
    its padding."""
    out = torch.zeros(numel, dtype=torch.float32)
    for i, lo, hi, at in pieces:
        params[i][lo:hi].read_into(out[at : at + hi - lo], plan)
    return out


def _check_names(saved: List[str], ours: List[str], where: str) -> None:
    missing = [n for n in ours if n not in set(saved)]
    extra = [n for n in saved if n not in set(ours)]
    if missing or extra:
        raise ValueError(
            f"load_checkpoint: the optimizer state in {where} trains other parameters than "
            f"this run: not saved {missing}, saved but not trained here {extra}"
        )


# --- the optimizer state of this rank ----------------------------------------------------------
@dataclass
class SavedState:
    """A checkpoint's optimizer state by parameter name, whatever its layout: what a re-cut
    needs. Filled from the regular files (saved_state) or from a universal checkpoint's
    per-parameter files (universal_load.py)."""

    values: Values  # name -> kind -> its elements (the whole, unpadded parameter)
    group_of: Dict[str, int]  # name -> the saved (sub)group that held it
    scalars: List[dict]  # per saved group: its inner state's non-elementwise entries (step)
    hypers: List[dict]  # per saved group: its hyperparameters
    globals: dict  # the rest of the saved state: loss scaler, overflow, ...
    where: str  # the folder errors name


def saved_state(
    ckpt: Checkpoint, sd: dict, part, bf16: bool, saved_world: int, shapes=None
) -> SavedState:
    """The optimizer state of a checkpoint of `saved_world` ranks by parameter name (lazy:
    nothing large is read yet). `part`: this run's PartitionLayout (None: no run, the
    conversion to a universal checkpoint); `bf16`: the optimizer files' name prefix."""
    names = [ckpt.optim_file(r, bf16) for r in range(saved_world)]
    states = [  # lazy: see Note [Streamed re-cut]
        migrate.zero_state(ckpt.load(n, lazy=True)["optimizer_state_dict"], part, ckpt.path(n))
        for n in names
    ]
    saved_stage = states[0]["zero_stage"]  # 1/2 and 3 differ in layout
    ranks = [_saved_groups(s, ckpt.path(n)) for s, n in zip(states, names)]
    shapes = sd["param_shapes"] if shapes is None else shapes
    if len(shapes) != len(ranks[0]):
        raise ValueError(
            f"checkpoint {ckpt.dir}: the model states list {len(shapes)} parameter groups "
            f"and the optimizer files {len(ranks[0])}"
        )
    if layout.sharded(saved_stage):
        values = _stage3_values(ranks, shapes, saved_world, ckpt.dir)
    else:
        pads = migrate.alignment_paddings(states[0])
        values = _stage12_values(ranks, shapes, pads, ckpt.dir)
    inner_keys = (migrate.masters_key(saved_stage), migrate.inner_key(saved_stage))
    return SavedState(
        values=values,
        group_of={name: g for g, group in enumerate(shapes) for name in group},
        scalars=[scalars for _, scalars, _ in ranks[0]],
        hypers=[hyper for _, _, hyper in ranks[0]],
        globals={k: v for k, v in states[0].items() if k not in inner_keys},
        where=ckpt.dir,
    )


def optimizer_state(
    ckpt: Checkpoint, sd: dict, module: torch.nn.Module, part, bf16: bool, saved_world: int
) -> dict:
    """This rank's optimizer state (its stage's layout: `part`, the stage's PartitionLayout)
    re-cut by parameter name from a checkpoint of `saved_world` ranks, whatever its flatten
    order, sub-groups and padding. `bf16`: the optimizer files' name prefix."""
    return recut(saved_state(ckpt, sd, part, bf16, saved_world), module, part)


def recut(saved: SavedState, module: torch.nn.Module, part) -> dict:
    """This rank's optimizer state in its stage's layout (`part`) from a saved state by
    name. Scalars and hyperparameters of each of this run's groups come from the saved
    group holding its first parameter."""
    values, group_of = saved.values, saved.group_of
    ours = layout.param_shapes(module, part.groups)
    _check_names(list(group_of), [n for group in ours for n in group], saved.where)

    masters, inner_state, hypers = [], {}, []
    plan = ReadPlan()
    for g, group in enumerate(ours):
        first = group_of[next(iter(group))]
        scalars, hyper = saved.scalars[first], saved.hypers[first]
        kinds = set().union(*(values[n].keys() for n in group))
        cut = {}
        for kind in kinds:
            parts = [values[n].get(kind, Slice.zeros(values[n]["fp32"].numel)) for n in group]
            cut[kind] = _cut(parts, part.numels[g], part.pieces[g], plan)
        masters.append(cut.pop("fp32"))
        if cut or scalars:
            inner_state[g] = {**scalars, **cut}
        hypers.append({**hyper, "params": [g]})
    plan.run()
    inner = {
        "state": inner_state,
        "param_groups": migrate.param_groups(hypers, part.param_groups, saved.where),
    }
    state = dict(saved.globals)
    state.update(
        {
            "zero_stage": part.zero_stage,
            migrate.masters_key(part.zero_stage): masters,
            migrate.inner_key(part.zero_stage): inner,
            "partition_count": part.partition_count,
        }
    )
    return state

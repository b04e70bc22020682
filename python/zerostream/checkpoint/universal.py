"""DeepSpeed's universal checkpoint: the optimizer state of a ZeRO checkpoint (stages 1-3) by
parameter name, loadable at any data-parallel world size and stage. This module writes one
from a regular checkpoint (DeepSpeed's `ds_to_universal`); universal_load.py reads it.

The layout (DeepSpeed's deepspeed/checkpoint/ds_to_universal.py, read 2026-11-29 at commit
edaa722, and its engine's loaders):

    <out>/zero/<param name>/fp32.pt        {"param": whole fp32 value, "cat_dim": 0}
    <out>/zero/<param name>/exp_avg.pt     the same for each elementwise optimizer state
    <out>/zero/<param name>/exp_avg_sq.pt
    <out>/zero/<param name>/step.pt        the step count as saved (a tensor or a number)
    <out>/zero/optimizer_state.pt          the rest of rank 0's ZeRO state (loss scaler, ...)
                                           and `param_groups`, the inner optimizer's groups
    <out>/*model_states.pt                 the model-states files, copied
    <parent of out>/latest_universal       the name of <out>

DeepSpeed writes stage 3's per-parameter files as bare flat tensors and keeps their step
only in optimizer_state.pt's `optimizer_state_dict`; zerostream writes every stage as
above (dicts, the parameter's shape, step.pt) and adds that `optimizer_state_dict` too, so
either reader loads either. Frozen parameters have no folder: their values stay in the
model-states files.

Frozen-in-time choices:
- The saved partitions are re-cut into whole values by reshard.py (every layout zerostream
  loads: its own, DeepSpeed 0.19's, another stage's), each saved tensor read once.
- The checkpoint must carry `universal_checkpoint_info` at stages 1/2 (the client saves it,
  or --inject_missing_state adds it), as DeepSpeed's converter requires. Its tensor- and
  pipeline-parallel patterns say how TP slices merge; zerostream checkpoints have one
  slice, so they only set `cat_dim` (1 for row-parallel names). Vocabulary padding is
  refused by name. With `strict`, a pattern that matches no parameter is an error.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from typing import Any, Dict, List

import torch

from . import files, layout, reshard
from .files import Checkpoint
from .slices import ReadPlan

logger = logging.getLogger("zerostream")

ZERO_DIR = "zero"
OPTIMIZER_STATE = "optimizer_state.pt"
LATEST_UNIVERSAL = "latest_universal"
INFO_KEY = "universal_checkpoint_info"
VERSION_KEY = "universal_checkpoint_version"
VERSION = 0.4
PARAM = "param"
CAT_DIM = "cat_dim"
FP32 = "fp32"
STEP = "step"

# universal_checkpoint_info keys holding name patterns (DeepSpeed's checkpoint/constants.py).
ROW_PARALLEL = "parameter_with_row_parallelism_patterns"
VOCABULARY = "vocabulary_parameter_patterns"
PATTERN_KEYS = (
    "pipeline_replicated_parameter_patterns",
    "tp_replicated_parameter_patterns",
    "parameter_to_average_patterns",
    ROW_PARALLEL,
    VOCABULARY,
    "parameter_with_2_sub_params_cat_dim_0",
)
SUB_PARAMS = "parameter_with_sub_params"

_OPTIM = re.compile(r"^(bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_?optim_states\.pt$")
_MODEL3 = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")


def param_dir(folder: str, name: str) -> str:
    """The folder of one parameter's files in a universal checkpoint `folder`."""
    return os.path.join(folder, ZERO_DIR, name)


class _Source:
    """The regular checkpoint being converted: its files and the facts of its save."""

    def __init__(self, folder: str):
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"ds_to_universal: --input_folder {folder} is not a folder")
        self.ckpt = Checkpoint(folder)
        names = sorted(os.listdir(folder))
        optim: Dict[str, re.Match] = {}
        for n in names:
            m = _OPTIM.match(n)
            if m is not None:
                optim[n] = m
        if not optim:
            raise FileNotFoundError(
                f"ds_to_universal: {folder} holds no ZeRO optimizer states "
                f"(*zero_pp_rank_<r>_mp_rank_00_optim_states.pt); universal checkpoints are made "
                f"from ZeRO stage 1-3 checkpoints (pass the tag folder, the one holding them)"
            )
        tp = sorted({int(m.group(3)) for m in optim.values()})
        if tp != [0]:
            raise NotImplementedError(
                f"ds_to_universal: {folder} holds model-parallel ranks {tp}; zerostream has no "
                f"tensor or pipeline parallelism, so it converts mp_rank 00 checkpoints only"
            )
        self.world = max(int(m.group(2)) for m in optim.values()) + 1
        self.bf16 = any((m.group(1) or "") == "bf16_" for m in optim.values())
        self.model_files = [n for n in names if _MODEL3.match(n)]
        whole = layout.model_states_name(0, sharded=False)
        if not self.model_files and os.path.isfile(self.ckpt.path(whole)):
            self.model_files = [whole]
        if not self.model_files:
            raise FileNotFoundError(
                f"ds_to_universal: {folder} has no model-states file ({whole} or "
                f"{layout.model_states_name(0, sharded=True)})"
            )
        self.model_name = self.model_files[0]
        self.sd = self.ckpt.load(self.model_name)
        self.sharded = self.model_name != whole
        if not self.sd.get("param_shapes"):
            raise ValueError(
                f"ds_to_universal: {self.ckpt.path(self.model_name)} lists no trained "
                f"parameters (param_shapes); it is not a ZeRO stage 1-3 checkpoint"
            )


def _info(src: _Source, inject: bool) -> dict:
    """The checkpoint's universal_checkpoint_info (DeepSpeed requires it at stages 1/2)."""
    info = src.sd.get(INFO_KEY)
    if info is None and inject:
        info = {VERSION_KEY: VERSION}
    if info is None and not src.sharded:
        raise ValueError(
            f"ds_to_universal: {src.ckpt.path(src.model_name)} has no {INFO_KEY!r}; save "
            f"the checkpoint with client_state={{{INFO_KEY!r}: {{}}}} or pass "
            f"--inject_missing_state"
        )
    info = dict(info or {})
    if info.get(SUB_PARAMS) or info.get(VOCABULARY):
        key = SUB_PARAMS if info.get(SUB_PARAMS) else VOCABULARY
        raise NotImplementedError(
            f"ds_to_universal: {src.ckpt.path(src.model_name)}: {INFO_KEY}.{key} describes "
            f"tensor-parallel slices of fused or padded parameters; zerostream checkpoints "
            f"have one slice per parameter and convert without it"
        )
    return info


def _check_patterns(info: dict, names: List[str], strict: bool, where: str) -> None:
    """DeepSpeed's strict check: every pattern the client gave must match a parameter."""
    unused = [
        p
        for key in PATTERN_KEYS
        for p in info.get(key) or []
        if not any(re.match(p, n) for n in names)
    ]
    if unused and strict:
        raise ValueError(
            f"ds_to_universal: {where}: {INFO_KEY} patterns {unused} match no parameter; "
            f"pass --no_strict to convert anyway"
        )
    if unused:
        logger.warning("ds_to_universal: patterns %s match no parameter", unused)


def _save(obj: Any, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(obj, path)


def _whole_values(saved: reshard.SavedState, shapes: Dict[str, torch.Size]) -> Dict[str, dict]:
    """Every parameter's whole value of each kind, read in one ordered pass per saved
    tensor (the whole optimizer state is in memory at once, as in DeepSpeed's converter)."""
    plan = ReadPlan()
    out: Dict[str, dict] = {}
    for name, kinds in saved.values.items():
        out[name] = {}
        for kind, piece in kinds.items():
            dst = torch.empty(piece.numel, dtype=torch.float32)
            piece.read_into(dst, plan)
            out[name][kind] = dst.view(shapes[name])
    plan.run()
    return out


def convert(
    input_folder: str,
    output_folder: str,
    inject_missing_state: bool = False,
    strict: bool = True,
) -> None:
    """Writes the universal checkpoint of the tag folder `input_folder` to `output_folder`
    (see the module's docstring for the layout) and `latest_universal` beside it."""
    src = _Source(input_folder)
    info = _info(src, inject_missing_state)
    shapes = {n: torch.Size(s) for group in src.sd["param_shapes"] for n, s in group.items()}
    _check_patterns(info, list(shapes), strict, input_folder)
    row_parallel = info.get(ROW_PARALLEL) or []

    saved = reshard.saved_state(src.ckpt, src.sd, None, src.bf16, src.world)
    values = _whole_values(saved, shapes)
    for name, kinds in values.items():
        cat_dim = 1 if any(re.match(p, name) for p in row_parallel) else 0
        for kind, value in kinds.items():
            path = os.path.join(param_dir(output_folder, name), f"{kind}.pt")
            _save({PARAM: value, CAT_DIM: cat_dim}, path)
        for key, value in saved.scalars[saved.group_of[name]].items():
            _save(value, os.path.join(param_dir(output_folder, name), f"{key}.pt"))

    _save(_optimizer_state(src, saved), os.path.join(output_folder, ZERO_DIR, OPTIMIZER_STATE))
    for name in src.model_files:
        shutil.copy2(src.ckpt.path(name), output_folder)
    parent, leaf = os.path.split(os.path.abspath(output_folder))
    files.save_text(leaf, os.path.join(parent, LATEST_UNIVERSAL))


def _optimizer_state(src: _Source, saved: reshard.SavedState) -> dict:
    """optimizer_state.pt: what is not per parameter. `param_groups` for either DeepSpeed
    loader (stages 1/2), `optimizer_state_dict` with each group's step (its stage-3 loader)."""
    hypers = [dict(h) for h in saved.hypers]
    state = {k: v for k, v in saved.globals.items() if k != "zero_stage"}
    state.update(
        {
            "zero_stage": int(saved.globals["zero_stage"]),
            "ds_version": src.sd.get("ds_version", layout.DS_LAYOUT_VERSION),
            "param_groups": hypers,
            "optimizer_state_dict": {
                "state": {g: dict(s) for g, s in enumerate(saved.scalars)},
                "param_groups": hypers,
            },
        }
    )
    return state


def main(args) -> None:
    """DeepSpeed's ds_to_universal.main: `args` holds input_folder, output_folder and,
    optional, inject_missing_state and strict. num_extract_workers, num_merge_workers and
    keep_temp_folder tune DeepSpeed's multi-process fragment files, which this conversion
    does not write (it reads each saved tensor once in one process)."""
    convert(
        args.input_folder,
        args.output_folder,
        inject_missing_state=bool(getattr(args, "inject_missing_state", False)),
        strict=bool(getattr(args, "strict", True)),
    )


def find_model_files(folder: str) -> List[str]:
    """The model-states files of a universal checkpoint folder, rank 0's first."""
    sharded = sorted(
        (n for n in os.listdir(folder) if _MODEL3.match(n)),
        key=lambda n: int(_MODEL3.match(n).group(1)),  # type: ignore[union-attr]
    )
    whole = layout.model_states_name(0, sharded=False)
    return sharded or ([whole] if os.path.isfile(os.path.join(folder, whole)) else [])

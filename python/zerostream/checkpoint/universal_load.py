"""Loading a universal checkpoint (universal.py has the layout) into a run of any
data-parallel world size and ZeRO stage 1-3 (checkpoint.load_universal: true).

Every rank reads the per-parameter files of the parameters it trains, lazily (their large
tensors stay FileTensors), and reshard.recut cuts its own partitions from them, as it does
from the partitions of a regular checkpoint (Note [Streamed re-cut] in reshard.py). The
model-states file gives the buffers, the frozen parameters, the counters, the LR
scheduler and the client state; the trained weights come from the fp32 masters, as in
DeepSpeed, which does not read the module state of a universal checkpoint.

Each saved (sub)group's step is the step of its parameters (step.pt, equal across the
group) or, in DeepSpeed's stage-3 files, optimizer_state.pt's `optimizer_state_dict`; its
hyperparameters are optimizer_state.pt's `param_groups`, matched to the groups by the
model-states file's `param_shapes`.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Set

import torch

from ..lazy_tensor import LazyTensor, materialize
from . import layout, reshard
from .files import Checkpoint
from .slices import ReadPlan, Slice
from .universal import (
    FP32,
    LATEST_UNIVERSAL,
    OPTIMIZER_STATE,
    PARAM,
    STEP,
    ZERO_DIR,
    find_model_files,
    param_dir,
)
from .zero_to_fp32 import merge_frozen


def latest_tag(load_dir: str) -> str:
    """The tag `latest_universal` names (DeepSpeed: a ValueError when it is missing)."""
    path = os.path.join(load_dir, LATEST_UNIVERSAL)
    if not os.path.isfile(path):
        raise ValueError(
            f"load_checkpoint: checkpoint.load_universal is true and {path} does not exist; "
            f"pass tag= (the universal checkpoint's folder name) or write that file "
            f"(ds_to_universal does)"
        )
    return layout.read_latest(load_dir, LATEST_UNIVERSAL)


def is_universal(directory: str) -> bool:
    """A universal checkpoint's folder: optimizer_state.pt under zero/, and no per-rank
    optimizer states beside it."""
    if not os.path.isfile(os.path.join(directory, ZERO_DIR, OPTIMIZER_STATE)):
        return False
    return not any(n.endswith("_optim_states.pt") for n in os.listdir(directory))


class UniversalCheckpoint:
    """One universal checkpoint folder, read for this run."""

    def __init__(self, directory: str, ckpt: Checkpoint):
        self.dir, self.ckpt = directory, ckpt
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"load_checkpoint: universal checkpoint {directory} is missing")
        self.model_files = find_model_files(directory)
        if not self.model_files:
            raise FileNotFoundError(
                f"load_checkpoint: universal checkpoint {directory} has no model-states file "
                f"({layout.model_states_name(0, False)} or {layout.model_states_name(0, True)})"
            )
        self.model_name = self.model_files[0]
        self.sharded = self.model_name != layout.model_states_name(0, sharded=False)
        optim = os.path.join(directory, ZERO_DIR, OPTIMIZER_STATE)
        if not os.path.isfile(optim):
            raise FileNotFoundError(
                f"load_checkpoint: {optim} is missing; {directory} is not a universal "
                f"checkpoint (ds_to_universal writes it)"
            )
        self.optim_path = optim

    def optimizer_globals(self) -> dict:
        return self.ckpt.load(os.path.join(ZERO_DIR, OPTIMIZER_STATE))

    # --- per-parameter files ---------------------------------------------------------------------
    def _read_param(self, name: str, shape: torch.Size) -> Dict[str, Any]:
        """The files of one parameter: elementwise states as Slices, other entries (step)
        as they were saved. Errors name the file and the parameter."""
        folder = param_dir(self.dir, name)
        if not os.path.isdir(folder):
            raise FileNotFoundError(
                f"load_checkpoint: universal checkpoint {self.dir} has no folder for parameter "
                f"{name!r} ({folder}), which this run trains"
            )
        out: Dict[str, Any] = {}
        numel = shape.numel()
        for fname in sorted(os.listdir(folder)):
            if not fname.endswith(".pt"):
                continue
            kind, path = fname[:-3], os.path.join(folder, fname)
            obj = self.ckpt.load(os.path.relpath(path, self.dir), lazy=True)
            value = obj[PARAM] if isinstance(obj, dict) and PARAM in obj else obj
            if isinstance(obj, dict) and PARAM not in obj:
                raise ValueError(
                    f"load_checkpoint: {path} (parameter {name!r}) holds a dict without "
                    f"{PARAM!r}: keys {sorted(obj)}"
                )
            tensor = isinstance(value, LazyTensor) or torch.is_tensor(value)
            if tensor and kind != STEP and value.dim() > 0:  # elementwise: fp32, moments
                if value.numel() != numel or (value.dim() > 1 and value.shape != shape):
                    raise ValueError(
                        f"load_checkpoint: {path} holds shape {tuple(value.shape)} and parameter "
                        f"{name!r} has shape {tuple(shape)} in this model"
                    )
                out[kind] = Slice.of(value)
            else:
                out[kind] = materialize(value)
        if FP32 not in out:
            raise FileNotFoundError(
                f"load_checkpoint: {os.path.join(folder, FP32 + '.pt')} is missing: no fp32 "
                f"master weights for parameter {name!r}"
            )
        return out

    def saved_state(
        self, sd: dict, names: List[str], shapes: Dict[str, torch.Size]
    ) -> reshard.SavedState:
        """The optimizer state of the parameters `names` (those this run trains), by name."""
        saved_shapes = sd.get("param_shapes") or []
        saved_group = {n: g for g, group in enumerate(saved_shapes) for n in group}
        # A param the saving run did not train has no files: _read_param names it.
        group_of = {n: saved_group.get(n, len(saved_shapes)) for n in names}
        n_groups = len(saved_shapes) + 1
        values: reshard.Values = {}
        scalars: List[Dict[str, Any]] = [{} for _ in range(n_groups)]
        kinds_seen: Set[str] = set()
        for name in names:
            entries = self._read_param(name, shapes[name])
            values[name] = {k: v for k, v in entries.items() if isinstance(v, Slice)}
            kinds_seen.update(values[name])
            group = scalars[group_of[name]]
            for key, value in entries.items():
                if isinstance(value, Slice):
                    continue
                if key in group and not _same(group[key], value):
                    raise ValueError(
                        f"load_checkpoint: {os.path.join(param_dir(self.dir, name), key)}.pt "
                        f"holds {value!r} and another parameter of its group {group[key]!r}"
                    )
                group[key] = value
        for name in names:
            missing = sorted(kinds_seen - set(values[name]))
            if missing:
                raise FileNotFoundError(
                    f"load_checkpoint: parameter {name!r} has no "
                    f"{', '.join(k + '.pt' for k in missing)} in {param_dir(self.dir, name)}, "
                    f"which the other parameters of {self.dir} have"
                )
        glob = self.optimizer_globals()
        hypers = _hypers(glob.get("param_groups"), n_groups, self.optim_path)
        _steps_from_globals(glob, scalars)
        globals_ = {
            k: v
            for k, v in glob.items()
            if k not in ("param_groups", "optimizer_state_dict", "fp32_flat_groups")
        }
        globals_.setdefault("zero_stage", 3 if self.sharded else 1)
        return reshard.SavedState(values, group_of, scalars, hypers, globals_, self.dir)

    # --- weights ---------------------------------------------------------------------------------
    def weights(
        self, sd: dict, module: torch.nn.Module, trained_here: Set[str]
    ) -> "UniversalWeights":
        return UniversalWeights(self, sd, module, trained_here)

    def fp32_values(
        self, names: List[str], shapes: Dict[str, torch.Size]
    ) -> Dict[str, torch.Tensor]:
        out = {}
        for name in names:
            piece = self._read_param(name, shapes[name])[FP32]
            out[name] = torch.empty(shapes[name], dtype=torch.float32)
            plan = ReadPlan()
            piece.read_into(out[name].view(-1), plan)
            plan.run()
        return out


def _same(a: Any, b: Any) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return bool(torch.equal(torch.as_tensor(a).float(), torch.as_tensor(b).float()))
    return bool(a == b)


def _hypers(saved: Optional[List[dict]], n_groups: int, where: str) -> List[dict]:
    """Each saved group's hyperparameters (`n_groups`: those of param_shapes, then one for
    params the saving run did not train): by index when there is one per group, else the
    first group's for all, as DeepSpeed's stage-3 loader does."""
    if not saved:
        raise ValueError(f"load_checkpoint: {where} has no 'param_groups'")
    if len(saved) >= n_groups - 1:
        return [dict(g) for g in saved[: n_groups - 1]] + [dict(saved[0])]
    return [dict(saved[0]) for _ in range(n_groups)]


def _steps_from_globals(glob: dict, scalars: List[Dict[str, Any]]) -> None:
    """A group whose parameters had no step.pt (DeepSpeed's stage-3 conversion) takes the
    step optimizer_state.pt's `optimizer_state_dict` holds: its own group's, else group 0's."""
    inner = glob.get("optimizer_state_dict")
    states = inner.get("state") if isinstance(inner, dict) else None
    if not states:
        return
    for g, group in enumerate(scalars):
        if "step" not in group:
            st = states.get(g, states.get(0, {}))
            if "step" in st:
                group["step"] = materialize(st["step"])


class UniversalWeights:
    """SavedWeights (zero/protocol.py) of a universal checkpoint: buffers from the model-states
    file, trained weights from the fp32 files, frozen ones from the model-states files."""

    sharded = True  # the stages take whole values from consolidated()/frozen()
    same_world = False
    frozen_fragments: Dict[str, Any] = {}

    def __init__(
        self, uc: UniversalCheckpoint, sd: dict, module: torch.nn.Module, trained_here: Set[str]
    ):
        self.uc, self.sd = uc, sd
        self.module = sd["module"]
        self.buffer_names = sd.get("buffer_names", [])
        self.trained = {n for group in sd.get("param_shapes") or [] for n in group}
        self.shapes = {n: layout.full_shape(p) for n, p in module.named_parameters()}
        self.trained_here = trained_here

    def consolidated(self) -> Dict[str, torch.Tensor]:
        names = [n for n in self.shapes if n in self.trained]
        return {**self.frozen(), **self.uc.fp32_values(names, self.shapes)}

    def frozen(self) -> Dict[str, torch.Tensor]:
        """The saved values of the params this run does not train: frozen ones from the
        model-states files, ones the saving run trained from their fp32 files."""
        out: Dict[str, torch.Tensor] = {}
        if self.uc.sharded:
            models = [self.uc.ckpt.load(n) for n in self.uc.model_files]
            merge_frozen(out, models, sharded=True, world=len(models))
        else:
            for n in self.sd.get("frozen_param_shapes") or {}:
                if n in self.module:
                    out[n] = materialize(self.module[n])
        untrained = [n for n in self.shapes if n in self.trained and n not in self.trained_here]
        out.update(self.uc.fp32_values(untrained, self.shapes))
        return {n: v for n, v in out.items() if n in self.shapes}

"""DeepSpeed 0.19's checkpoint files written by hand, for the migration tests that run without
DeepSpeed: the documented layout (shared/reference/deepspeed_compat.md §3) with the details
DeepSpeed 0.19.8 showed when run by ds_run.py (per-parameter alignment padding, stage-3
sub-groups, elastic state, the stage-0 FP16 wrapper state).

DeepSpeed's pickled classes are imitated by classes that `fake_deepspeed()` registers under
DeepSpeed's module names in sys.modules of this process only, so the files pickle the very
globals DeepSpeed's own do (the same opcodes: NEWOBJ+BUILD for the loss scalers and
fragment_address, a call with the value for the ZeroStageEnum).
"""

import contextlib
import dataclasses
import enum
import math
import os
import pickletools
import sys
import types
import zipfile
from collections import OrderedDict

import torch

DS_VERSION = "0.19.8"
_MODULES = (
    "deepspeed",
    "deepspeed.runtime",
    "deepspeed.runtime.fp16",
    "deepspeed.runtime.fp16.loss_scaler",
    "deepspeed.runtime.zero",
    "deepspeed.runtime.zero.config",
    "deepspeed.utils",
    "deepspeed.utils.tensor_fragment",
)


def _classes():
    scaler_mod, zero_mod, frag_mod = (
        "deepspeed.runtime.fp16.loss_scaler",
        "deepspeed.runtime.zero.config",
        "deepspeed.utils.tensor_fragment",
    )

    class LossScaler:
        def __init__(self, scale=1.0):
            self.cur_scale, self.dynamic = scale, False

    class DynamicLossScaler:
        def __init__(self, scale, cur_iter, last_overflow_iter, window, hysteresis):
            self.cur_scale, self.dynamic = scale, True
            self.cur_iter, self.last_overflow_iter = cur_iter, last_overflow_iter
            self.scale_factor, self.scale_window, self.min_scale = 2.0, window, 1.0
            self.delayed_shift = self.cur_hysteresis = hysteresis
            self.consecutive_hysteresis, self.raise_error_at_min_scale = False, True
            self.dtype = torch.float16

    ZeroStageEnum = enum.Enum(
        "ZeroStageEnum",
        [("disabled", 0), ("optimizer_states", 1), ("gradients", 2), ("weights", 3)],
        type=int,
        module=zero_mod,
    )
    fragment_address = dataclasses.make_dataclass(
        "fragment_address", [("numel", int), ("start", int)]
    )
    for cls, mod in (
        (LossScaler, scaler_mod),
        (DynamicLossScaler, scaler_mod),
        (fragment_address, frag_mod),
    ):
        cls.__module__, cls.__qualname__ = mod, cls.__name__
    return types.SimpleNamespace(
        LossScaler=LossScaler,
        DynamicLossScaler=DynamicLossScaler,
        ZeroStageEnum=ZeroStageEnum,
        fragment_address=fragment_address,
    )


@contextlib.contextmanager
def fake_deepspeed():
    """DeepSpeed's pickled classes under their names, in this process only."""
    present = [m for m in _MODULES if m in sys.modules]
    if present:
        raise RuntimeError(f"{present} already imported: these files must not need DeepSpeed")
    ns = _classes()
    mods = {name: types.ModuleType(name) for name in _MODULES}
    mods["deepspeed.runtime.fp16.loss_scaler"].LossScaler = ns.LossScaler
    mods["deepspeed.runtime.fp16.loss_scaler"].DynamicLossScaler = ns.DynamicLossScaler
    mods["deepspeed.runtime.zero.config"].ZeroStageEnum = ns.ZeroStageEnum
    mods["deepspeed.utils.tensor_fragment"].fragment_address = ns.fragment_address
    sys.modules.update(mods)
    try:
        yield ns
    finally:
        for name in _MODULES:
            sys.modules.pop(name, None)


@contextlib.contextmanager
def _saved_on(device, rank):
    """With device "cuda", torch.save in this block records every storage at "cuda:<rank>",
    as a DeepSpeed run on GPUs saves its device tensors (loading such a file on a machine
    without CUDA needs a map_location). Otherwise nothing changes."""
    if device != "cuda":
        yield
        return
    entry = (-1, lambda obj: f"cuda:{rank}", lambda obj, location: None)
    torch.serialization._package_registry.insert(0, entry)  # the first tagger wins
    try:
        yield
    finally:
        torch.serialization._package_registry.remove(entry)


def storage_locations(path):
    """The storage locations a checkpoint file's pickle names ("cpu", "cuda:1", ...)."""
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    strings = {arg for _, arg, _ in pickletools.genops(data) if isinstance(arg, str)}
    return {s for s in strings if s == "cpu" or s.startswith("cuda")}


# --- the files ----------------------------------------------------------------------------------
def _param_group(lr: float, params) -> dict:
    """torch AdamW's param group keys, as DeepSpeed's inner torch optimizer saves them."""
    return {
        "lr": lr,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "weight_decay": 0.01,
        "amsgrad": False,
        "maximize": False,
        "foreach": None,
        "capturable": False,
        "differentiable": False,
        "fused": None,
        "decoupled_weight_decay": True,
        "params": params,
    }


def _model_states(model, values, spec, world, param_shapes, rank=None) -> dict:
    module = OrderedDict()
    for name, t in model.state_dict().items():
        base = values.get(name, {"fp32": t}).get("fp32", t)
        module[name] = torch.empty(0) if spec["stage"] == 3 else base.clone()
    module["head.weight"] = module["tok.weight"]
    return {
        "module": module,
        "buffer_names": [],
        "optimizer": None,
        "param_shapes": param_shapes,
        "frozen_param_shapes": OrderedDict() if spec["stage"] >= 2 else None,
        "shared_params": {"head.weight": "tok.weight"} if spec["stage"] < 3 else {},
        "frozen_param_fragments": OrderedDict() if spec["stage"] >= 2 else None,
        "lr_scheduler": None,
        "data_sampler": None,
        "random_ltd": None,
        "skipped_steps": 0,
        "global_steps": spec["global_steps"],
        "global_samples": spec["global_steps"] * 8,
        "dp_world_size": world,
        "mp_world_size": 1,
        "checkpoint_parallel_dimensions": {"pp_degree": 1, "tp_degree": 1},
        "ds_config": spec["config"],
        "ds_version": DS_VERSION,
        **spec.get("client", {}),
    }


def _scaler(ns, spec):
    dyn = spec.get("dynamic_scaler")
    return ns.DynamicLossScaler(**dyn) if dyn else ns.LossScaler(1.0)


def _stage12_files(ns, values, spec, world, order, pads):
    """One flat group in `order`, `pads[i]` zeros after param i, padded to 2*world."""
    pieces, mappings, start = {}, OrderedDict(), 0
    for kind in ("fp32", "exp_avg", "exp_avg_sq"):
        chunks = []
        for name, pad in zip(order, pads):
            chunks += [values[name][kind].reshape(-1).float(), torch.zeros(pad)]
        flat = torch.cat(chunks)
        total = math.ceil(flat.numel() / (2 * world)) * 2 * world
        pieces[kind] = torch.cat([flat, torch.zeros(total - flat.numel())]).chunk(world)
        unpadded = flat.numel()
    for name, pad in zip(order, pads):
        n = values[name]["fp32"].numel()
        mappings[name] = ns.fragment_address(numel=n, start=start)
        start += n + pad
    size = pieces["fp32"][0].numel()
    out = []
    for r in range(world):
        group_pad = max(0, (r + 1) * size - unpadded) if r == world - 1 else 0
        fp32 = pieces["fp32"][r][: size - group_pad].clone()
        moments = {k: pieces[k][r].clone() for k in ("exp_avg", "exp_avg_sq")}
        if spec.get("elastic"):
            moments = {k: v[: size - group_pad] for k, v in moments.items()}
            base = [{"step": torch.tensor(float(spec["step"])), **moments}]
        else:
            base = {
                "state": {0: {"step": torch.tensor(float(spec["step"])), **moments}},
                "param_groups": [_param_group(spec["lr"], [0])],
            }
        out.append(
            {
                "loss_scaler": _scaler(ns, spec),
                "dynamic_loss_scale": bool(spec.get("dynamic_scaler")),
                "overflow": False,
                "clip_grad": 0.5,
                "base_optimizer_state": base,
                "single_partition_of_fp32_groups": [fp32],
                "zero_stage": ns.ZeroStageEnum(spec["stage"]),
                "group_paddings": [group_pad],
                "param_alignment_paddings": [list(pads)],
                "partition_count": [world],
                "ds_version": DS_VERSION,
                "param_slice_mappings": [mappings],
            }
        )
    return out


def _stage3_files(ns, values, spec, world, sub_groups):
    """Each sub-group: its params' shards, ceil(numel/world) each, concatenated."""
    out = []
    for r in range(world):
        flats = {k: [] for k in ("fp32", "exp_avg", "exp_avg_sq")}
        for names in sub_groups:
            for kind in flats:
                shards = []
                for name in names:
                    v = values[name][kind].reshape(-1).float()
                    shard = math.ceil(v.numel() / world)
                    piece = torch.zeros(shard)
                    lo, hi = r * shard, min(v.numel(), (r + 1) * shard)
                    if hi > lo:
                        piece[: hi - lo] = v[lo:hi]
                    shards.append(piece)
                flats[kind].append(torch.cat(shards))
        state = {
            i: {
                "step": torch.tensor(float(spec["step"])),
                **{k: flats[k][i] for k in flats if k != "fp32"},
            }
            for i in range(len(sub_groups))
        }
        out.append(
            {
                "zero_stage": ns.ZeroStageEnum(3),
                "loss_scaler": _scaler(ns, spec),
                "dynamic_loss_scale": bool(spec.get("dynamic_scaler")),
                "overflow": False,
                "partition_count": world,
                "optimizer_state_dict": {
                    "state": state,
                    "param_groups": [_param_group(spec["lr"], list(range(len(sub_groups))))],
                },
                "fp32_flat_groups": flats["fp32"],
            }
        )
    return out


def _stage0_optimizer(values, spec, names):
    state = {
        i: {
            "step": torch.tensor(float(spec["step"])),
            "exp_avg": values[n]["exp_avg"].clone(),
            "exp_avg_sq": values[n]["exp_avg_sq"].clone(),
        }
        for i, n in enumerate(names)
    }
    torch_state = {
        "state": state,
        "param_groups": [_param_group(spec["lr"], list(range(len(names))))],
    }
    if spec.get("fp16_wrapper"):  # DeepSpeed's fused FP16_Optimizer (stage 0 with fp16)
        dyn = spec["dynamic_scaler"]
        return {
            "dynamic_loss_scale": True,
            "cur_scale": dyn["scale"],
            "cur_iter": dyn["cur_iter"],
            "last_overflow_iter": dyn["last_overflow_iter"],
            "scale_factor": 2.0,
            "scale_window": dyn["window"],
            "optimizer_state_dict": torch_state,
            "fp32_groups_flat": [torch.cat([values[n]["fp32"].reshape(-1) for n in names])],
            "clip_grad": 0.5,
        }
    return torch_state


def write(root, model, values, spec, world):
    """A DeepSpeed-layout checkpoint of `model` holding `values` (name -> fp32, exp_avg,
    exp_avg_sq) under ROOT/<tag>. spec: stage, config, step, lr, global_steps, and
    optionally order (flatten order), pads (alignment padding per param in that order),
    sub_groups (stage 3: lists of names), elastic, dynamic_scaler, fp16_wrapper, client, and
    device "cuda" (each rank's tensors saved on its GPU, the model file on rank 0's)."""
    names = [n for n, _ in model.named_parameters()]
    order = spec.get("order", names)
    tag = f"global_step{spec['global_steps']}"
    os.makedirs(os.path.join(root, tag), exist_ok=True)
    device = spec.get("device", "cpu")
    with fake_deepspeed() as ns:
        stage = spec["stage"]
        if stage == 0:
            sd = _model_states(model, values, spec, world, None)
            sd["optimizer"] = _stage0_optimizer(values, spec, names)
            with _saved_on(device, 0):
                torch.save(sd, os.path.join(root, tag, "mp_rank_00_model_states.pt"))
        elif stage in (1, 2):
            shapes = [OrderedDict((n, values[n]["fp32"].shape) for n in order)]
            pads = spec.get("pads", [0] * len(order))
            sd = _model_states(model, values, spec, world, shapes)
            with _saved_on(device, 0):
                torch.save(sd, os.path.join(root, tag, "mp_rank_00_model_states.pt"))
            for r, opt in enumerate(_stage12_files(ns, values, spec, world, order, pads)):
                with _saved_on(device, r):
                    _save_optim(root, tag, r, opt, spec)
        else:
            groups = spec.get("sub_groups", [names])
            shapes = [OrderedDict((n, values[n]["fp32"].shape) for n in g) for g in groups]
            for r, opt in enumerate(_stage3_files(ns, values, spec, world, groups)):
                sd = _model_states(model, values, spec, world, shapes, rank=r)
                with _saved_on(device, r):
                    torch.save(
                        sd, os.path.join(root, tag, f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")
                    )
                    _save_optim(root, tag, r, opt, spec)
    with open(os.path.join(root, "latest"), "w") as f:
        f.write(tag)
    return tag


def _save_optim(root, tag, rank, opt, spec):
    prefix = "bf16_" if spec["config"].get("bf16", {}).get("enabled") else ""
    path = os.path.join(root, tag, f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    torch.save(
        {"optimizer_state_dict": opt, "ds_config": spec["config"], "ds_version": DS_VERSION}, path
    )

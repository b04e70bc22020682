#!/usr/bin/env python3
"""Whole fp32 weights from a ZeRO checkpoint (stages 1-3), in DeepSpeed's layout.

This file needs only torch (safetensors / huggingface_hub for those outputs): it is copied
next to every checkpoint as `zero_to_fp32.py`, so the weights can be recovered where neither
zerostream nor DeepSpeed is installed:

    python zero_to_fp32.py CHECKPOINT_DIR OUTPUT_DIR [--tag TAG] [--safe_serialization]

CHECKPOINT_DIR is the folder holding `latest` and the tag folders. The optimizer files are
memory-mapped and only their fp32 partitions are touched, so the peak memory is about one
whole fp32 model, not the optimizer state.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
from collections import OrderedDict
from typing import Callable, Dict, List, Optional

import torch


def _default_load(path: str):
    """torch.load, weights only. Where zerostream is installed, DeepSpeed's own checkpoints
    (which pickle a few DeepSpeed classes) are read too, through its stand-ins."""
    try:
        from zerostream.checkpoint.compat_unpickle import load
    except ImportError:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    return load(path, mmap=True)


def _natural_key(path: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", os.path.basename(path))]


def _files(ds_dir: str, suffix: str) -> List[str]:
    return get_checkpoint_files(ds_dir, f"*{suffix}")


def get_checkpoint_files(checkpoint_dir: str, glob_pattern: str) -> List[str]:
    """The files of a tag folder matching `glob_pattern`, in natural order (rank 10 after
    rank 9); FileNotFoundError naming the folder when none match. DeepSpeed's helper, which
    PyTorch Lightning's checkpoint converter calls."""
    found = sorted(glob.glob(os.path.join(checkpoint_dir, glob_pattern)), key=_natural_key)
    if not found:
        raise FileNotFoundError(f"no '{glob_pattern}' files in {checkpoint_dir}")
    return found


def get_optim_files(checkpoint_dir: str) -> List[str]:
    """Every rank's optimizer-state file of a tag folder, rank 0 first."""
    return get_checkpoint_files(checkpoint_dir, "*_optim_states.pt")


def get_model_state_files(checkpoint_dir: str) -> List[str]:
    """Every model-state file of a tag folder (one per rank at stage 3, else one)."""
    return get_checkpoint_files(checkpoint_dir, "*_model_states.pt")


def get_model_state_file(checkpoint_dir: str, zero_stage: int) -> str:
    """Rank 0's model-state file of a tag folder saved at `zero_stage` (the file that holds
    the client state): `mp_rank_00_model_states.pt` at stages 0-2, the sharded name at 3."""
    if not os.path.isdir(checkpoint_dir):
        raise FileNotFoundError(f"checkpoint folder {checkpoint_dir} does not exist")
    # Inline, not from layout.py: this file runs alone beside a checkpoint.
    name = "zero_pp_rank_0_mp_rank_00" if int(zero_stage) == 3 else "mp_rank_00"
    path = os.path.join(checkpoint_dir, f"{name}_model_states.pt")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"no model-state file {path} (a ZeRO stage {zero_stage} checkpoint has one)"
        )
    return path


def tag_dir(checkpoint_dir: str, tag: Optional[str] = None) -> str:
    """The folder of `tag` (from `latest` when None)."""
    if not os.path.isdir(checkpoint_dir):
        raise FileNotFoundError(f"checkpoint directory {checkpoint_dir} does not exist")
    if tag is None:
        latest = os.path.join(checkpoint_dir, "latest")
        if not os.path.isfile(latest):
            raise ValueError(f"Unable to find 'latest' file at {latest}; pass a tag")
        with open(latest) as f:
            tag = f.read().strip()
    path = os.path.join(checkpoint_dir, tag)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint tag directory {path} does not exist")
    return path


def _numel(shape) -> int:
    return math.prod(shape)


def _sharded(sd: dict) -> Optional[bool]:
    """Whether an optimizer state is laid out sharded (ZeRO stage 3: per-rank model files,
    partitions made of per-parameter shards) rather than flat (stages 1/2, and DeepSpeed's
    BF16_Optimizer, which saves no stage); None when it is no ZeRO optimizer state. Told by
    the key of the fp32 partitions, which names the layout."""
    if "fp32_flat_groups" in sd:
        return True
    return False if "single_partition_of_fp32_groups" in sd else None


def _fp32_partitions(optim: dict) -> List[torch.Tensor]:
    sd = optim["optimizer_state_dict"]
    key = "fp32_flat_groups" if _sharded(sd) else "single_partition_of_fp32_groups"
    return list(sd[key])


def fp32_state_dict_of_dir(
    ds_dir: str,
    exclude_frozen_parameters: bool = False,
    load: Callable[[str], dict] = _default_load,
) -> "OrderedDict[str, torch.Tensor]":
    """The whole fp32 state_dict of one tag folder (buffers, trained and frozen params, tied
    aliases), on the CPU."""
    model_files = _files(ds_dir, "_model_states.pt")
    optim_files = _files(ds_dir, "_optim_states.pt")
    optims = [load(optim_files[0])]
    first = optims[0]["optimizer_state_dict"]
    sharded = _sharded(first)
    if sharded is None:
        raise ValueError(f"{optim_files[0]} is not a ZeRO optimizer checkpoint")
    world = first["partition_count"]
    world = max(world) if isinstance(world, (list, tuple)) else int(world)
    if world != len(optim_files):
        raise ValueError(
            f"Expected {world} of '*_optim_states.pt' under {ds_dir} but found "
            f"{len(optim_files)} files: a rank's save did not complete or files were removed"
        )
    models = [load(f) for f in (model_files if sharded else model_files[:1])]
    model = models[0]
    if "buffer_names" not in model:
        raise ValueError(f"{model_files[0]} is not a model-states checkpoint")
    out: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    for name, value in model["module"].items():
        if name in model["buffer_names"]:
            out[name] = value.float() if value.is_floating_point() else value
    optims += [load(f) for f in optim_files[1:]]
    partitions = [_fp32_partitions(o) for o in optims]
    if not sharded:
        # DeepSpeed's parameter_alignment pads each parameter inside the flat group.
        pads = first.get("param_alignment_paddings")
        _merge_stage12(out, model, partitions, world, ds_dir, pads)
    else:
        _merge_stage3(out, model, partitions, world, ds_dir)
    if not exclude_frozen_parameters:
        merge_frozen(out, models, sharded, world)
    for alias, owner in model.get("shared_params", {}).items():
        if owner in out:
            out[alias] = out[owner]
    return out


def _merge_stage12(out, model, partitions, world, ds_dir, pads=None) -> None:
    for g, shapes in enumerate(model["param_shapes"]):
        full = torch.cat([p[g].reshape(-1).float() for p in partitions])
        group_pads = list(pads[g]) if pads else [0] * len(shapes)
        offset = 0
        for (name, shape), pad in zip(shapes.items(), group_pads):
            n = _numel(shape)
            if offset + n > full.numel():
                raise ValueError(f"{ds_dir}: group {g} ends before parameter {name!r}")
            out[name] = full.narrow(0, offset, n).view(shape)  # views: one copy in all
            offset += n + int(pad)
        align = 2 * world
        if math.ceil(offset / align) != math.ceil(full.numel() / align):
            raise ValueError(
                f"{ds_dir}: group {g} holds {full.numel()} elements but its parameters "
                f"take {offset}: the files are not one checkpoint"
            )


def _merge_stage3(out, model, partitions, world, ds_dir) -> None:
    flats = [torch.cat([t.reshape(-1) for t in p]) if p else torch.empty(0) for p in partitions]
    offset = 0
    for shapes in model["param_shapes"]:
        for name, shape in shapes.items():
            n = _numel(shape)
            shard = math.ceil(n / world)
            pieces = [f.narrow(0, offset, shard) for f in flats]
            out[name] = torch.cat(pieces).narrow(0, 0, n).float().view(shape).clone()
            offset += shard
    if offset != flats[0].numel():
        raise ValueError(
            f"{ds_dir}: each rank holds {flats[0].numel()} elements but the parameters take "
            f"{offset}: the files are not one checkpoint"
        )


def merge_frozen(out, models, sharded: bool, world) -> None:
    """Adds the frozen params' whole values from the model-states dicts (`sharded`, stage 3:
    one per rank, each holding its shard)."""
    shapes = models[0].get("frozen_param_shapes") or {}
    for name, shape in shapes.items():
        if not sharded:
            out[name] = models[0]["frozen_param_fragments"][name].float()
        else:
            frags = [m["frozen_param_fragments"][name].reshape(-1) for m in models]
            out[name] = torch.cat(frags).narrow(0, 0, _numel(shape)).float().view(shape)


def get_fp32_state_dict_from_zero_checkpoint(
    checkpoint_dir: str,
    tag: Optional[str] = None,
    exclude_frozen_parameters: bool = False,
    lazy_mode: bool = False,
) -> "OrderedDict[str, torch.Tensor]":
    """DeepSpeed's function of the same name. `lazy_mode` is accepted; the tensors returned
    are already whole (`.contiguous()` on them is a no-op, as the lazy objects need)."""
    return fp32_state_dict_of_dir(tag_dir(checkpoint_dir, tag), exclude_frozen_parameters)


def _parse_size(size) -> Optional[int]:
    if size is None or isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)\s*", str(size).upper())
    if not match:
        raise ValueError(f"max_shard_size: expected a size such as '5GB'; got {size!r}")
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
    scale.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})
    return int(float(match.group(1)) * scale[match.group(2)])


def _shards(state: Dict[str, torch.Tensor], max_bytes: Optional[int]) -> List[List[str]]:
    """Names per output file, in order, each file at most max_bytes (a larger tensor alone)."""
    shards: List[List[str]] = [[]]
    size = 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if max_bytes is not None and shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def _compact(t: torch.Tensor) -> torch.Tensor:
    """A tensor that owns its storage: torch.save writes a view's whole storage."""
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        return t.clone()
    return t.contiguous()


def convert_zero_checkpoint_to_fp32_state_dict(
    checkpoint_dir: str,
    output_dir: str,
    max_shard_size="5GB",
    safe_serialization: bool = False,
    tag: Optional[str] = None,
    exclude_frozen_parameters: bool = False,
) -> List[str]:
    """Writes `pytorch_model.bin` (or `model.safetensors`), split into numbered shards with
    an index when larger than max_shard_size, as DeepSpeed does. Returns the files."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    os.makedirs(output_dir, exist_ok=True)
    base, ext = ("model", "safetensors") if safe_serialization else ("pytorch_model", "bin")
    shards = _shards(state, _parse_size(max_shard_size))
    names = (
        [f"{base}.{ext}"]
        if len(shards) == 1
        else [f"{base}-{i + 1:05d}-of-{len(shards):05d}.{ext}" for i in range(len(shards))]
    )
    weight_map = {}
    for fname, keys in zip(names, shards):
        part = {k: _compact(state[k]) for k in keys}
        if safe_serialization:
            from safetensors.torch import save_file

            # safetensors refuses shared storage: tied aliases get their own copy.
            seen, unique = set(), {}
            for k, t in part.items():
                ptr = t.data_ptr()
                unique[k] = t.clone() if ptr in seen else t
                seen.add(ptr)
            save_file(unique, os.path.join(output_dir, fname), metadata={"format": "pt"})
        else:
            torch.save(part, os.path.join(output_dir, fname))
        weight_map.update({k: fname for k in keys})
    if len(shards) > 1:
        total = sum(t.numel() * t.element_size() for t in state.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        with open(os.path.join(output_dir, f"{base}.{ext}.index.json"), "w") as f:
            json.dump(index, f, indent=2)
    return [os.path.join(output_dir, n) for n in names]


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir: str, tag: Optional[str] = None):
    """Moves `model` to the CPU and loads the checkpoint's fp32 weights into it
    (strict=False, as DeepSpeed does). Returns the model."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command line of this script and of `zerostream zero-to-fp32` (DeepSpeed's
    underscore spellings and dashed ones both work)."""
    parser.add_argument("checkpoint_dir", help="the folder holding 'latest' and the tags")
    parser.add_argument("output_dir", help="where the weight files are written")
    parser.add_argument("-t", "--tag", default=None, help="checkpoint tag (default: latest)")
    parser.add_argument("--max_shard_size", "--max-shard-size", default="5GB")
    parser.add_argument(
        "--safe_serialization", "--safetensors", action="store_true", help="model.safetensors"
    )
    parser.add_argument(
        "--exclude_frozen_parameters", "--exclude-frozen-parameters", action="store_true"
    )
    parser.add_argument("-d", "--debug", action="store_true", help="accepted; no effect")


def run(args) -> int:
    """Writes the weights; a missing or inconsistent checkpoint is one line on stderr and
    exit status 2."""
    try:
        written = convert_zero_checkpoint_to_fp32_state_dict(
            args.checkpoint_dir,
            args.output_dir,
            max_shard_size=args.max_shard_size,
            safe_serialization=args.safe_serialization,
            tag=args.tag,
            exclude_frozen_parameters=args.exclude_frozen_parameters,
        )
    except (OSError, ValueError) as exc:
        print(f"zero_to_fp32: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="zero_to_fp32", description="Whole fp32 weights from a ZeRO checkpoint"
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

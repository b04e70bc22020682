"""DeepSpeed's checkpoint layout (reference §3.1-3.3): file names, the tag, and the model
facts that `zero_to_fp32` reads (parameter names in flatten order, buffers, tied aliases).

Everything written is plain data (tensors, ints, strings, lists, dicts, OrderedDict,
torch.Size), so a file loads with `torch.load(weights_only=True)` and needs neither
zerostream nor DeepSpeed: the loss scaler is a dict and `zero_stage` an int where DeepSpeed
pickles its own classes.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Dict, List, Tuple

import torch

# The DeepSpeed release whose layout and key names these files follow; readers such as
# DeepSpeed's zero_to_fp32 only log it.
DS_LAYOUT_VERSION = "0.19.8"
MP_RANK = 0  # no tensor/pipeline parallelism: every file is model-parallel rank 00


def default_tag(global_steps: int) -> str:
    return f"global_step{global_steps}"


# DeepSpeed's file layout by the ZeRO stage a file says saved it (reference §3.2-3.3): sharded
# (stage 3: a model-states file per DP rank with its shards of the frozen params, optimizer
# partitions made of per-parameter shards) or not (whole weights in one model-states file
# and, at stages 1/2, partitions cut from flat groups). A fact about the files, not about the
# stage that runs: that one states its layout itself (zero/protocol.py, PartitionLayout).
SHARDED_LAYOUT = {0: False, 1: False, 2: False, 3: True}


def sharded(zero_stage: int) -> bool:
    """Whether a checkpoint (or an optimizer state) saved at `zero_stage` is laid out sharded."""
    try:
        return SHARDED_LAYOUT[int(zero_stage)]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"zero_stage {zero_stage!r} is not a ZeRO stage (0-3)") from None


def model_states_name(dp_rank: int, sharded: bool) -> str:
    """Whole weights: one file, written by DP rank 0; sharded weights: one per DP rank."""
    if sharded:
        return f"zero_pp_rank_{dp_rank}_mp_rank_{MP_RANK:02d}_model_states.pt"
    return f"mp_rank_{MP_RANK:02d}_model_states.pt"


def optim_states_name(dp_rank: int, bf16: bool) -> str:
    prefix = "bf16_" if bf16 else ""
    return f"{prefix}zero_pp_rank_{dp_rank}_mp_rank_{MP_RANK:02d}_optim_states.pt"


def optim_states_candidates(dp_rank: int, bf16: bool) -> List[str]:
    """The names a loader accepts, its own prefix first (DeepSpeed falls back to the other
    prefix and to the legacy name without the underscore)."""
    own, other = optim_states_name(dp_rank, bf16), optim_states_name(dp_rank, not bf16)
    legacy = f"zero_pp_rank_{dp_rank}_mp_rank_{MP_RANK:02d}optim_states.pt"
    return [own, other, legacy]


def read_latest(load_dir: str, name: str = "latest") -> str:
    """The tag the file `name` in `load_dir` holds ("latest", or "latest_universal")."""
    path = os.path.join(load_dir, name)
    with open(path) as f:
        tag = f.read().strip()
    if not tag:
        raise ValueError(f"checkpoint: {path} is empty; it should hold the tag to load")
    return tag


def check_tag(tag: str) -> str:
    tag = str(tag)
    if not tag or tag in (".", "..") or os.sep in tag or tag.startswith("."):
        raise ValueError(
            f"save_checkpoint: tag {tag!r} is not usable as a directory name (empty, "
            f"hidden, or containing {os.sep!r})"
        )
    return tag


# --- names of the model's tensors --------------------------------------------------------------
def param_names(module: torch.nn.Module) -> Dict[int, str]:
    """id(param) -> its first name (state_dict order), the name a tied param is saved under."""
    names: Dict[int, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), name)
    return names


def shared_params(module: torch.nn.Module) -> Dict[str, str]:
    """alias -> owner for tied parameters (an output head sharing the embedding)."""
    owner: Dict[int, str] = {}
    aliases: Dict[str, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in owner:
            aliases[name] = owner[id(p)]
        else:
            owner[id(p)] = name
    return aliases


def buffer_names(module: torch.nn.Module, state_keys) -> List[str]:
    """Persistent buffers only: the ones among the module's state_dict keys."""
    state_keys = set(state_keys)
    return [name for name, _ in module.named_buffers() if name in state_keys]


def full_shape(p: torch.nn.Parameter) -> torch.Size:
    """The whole parameter's shape (a stage-3 param's data is an empty placeholder)."""
    shape = getattr(p, "ds_shape", None)
    return torch.Size(shape) if shape is not None else p.shape


def param_shapes(
    module: torch.nn.Module, groups: List[List[torch.nn.Parameter]]
) -> List["OrderedDict[str, torch.Size]"]:
    """Per optimizer group, name -> shape in the exact flatten order of its partitions."""
    names = param_names(module)
    out = []
    for params in groups:
        shapes: "OrderedDict[str, torch.Size]" = OrderedDict()
        for p in params:
            if id(p) not in names:
                raise ValueError(
                    f"save_checkpoint: an optimizer parameter of shape {tuple(full_shape(p))} "
                    f"is not a parameter of the engine's module, so it has no name to be "
                    f"saved under"
                )
            shapes[names[id(p)]] = full_shape(p)
        out.append(shapes)
    return out


def frozen_params(
    module: torch.nn.Module, trained: List[List[torch.nn.Parameter]]
) -> List[Tuple[str, torch.nn.Parameter]]:
    """(name, param) of the module's parameters no optimizer group holds."""
    held = {id(p) for params in trained for p in params}
    seen, out = set(), []
    for name, p in module.named_parameters():
        if id(p) not in held and id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out

"""Reading checkpoint files that DeepSpeed wrote, without DeepSpeed and without running code.

DeepSpeed 0.19 pickles a few of its own objects into its checkpoint files (found by running
it, see tests/python/checkpoint/test_migration.py): the loss scaler
(`deepspeed.runtime.fp16.loss_scaler.LossScaler` or `DynamicLossScaler`, a plain object with
`cur_scale`, `dynamic`, ... in its `__dict__`), the ZeRO stage
(`deepspeed.runtime.zero.config.ZeroStageEnum`, an int enum pickled as a call with its value)
and, per parameter, where its piece starts in the flat partition
(`deepspeed.utils.tensor_fragment.fragment_address`, a dataclass of `numel` and `start`).
Everything else is torch's: tensors, `torch.Size`, dtypes, `collections.OrderedDict`.

Files are loaded by torch's weights-only unpickler, which refuses every global not on its
list; the list is widened only by the stand-ins below, registered under DeepSpeed's names.
A stand-in is a data holder with no behaviour: unpickling one runs no DeepSpeed code (none is
imported), and `to_plain` then turns it into the plain dict or int zerostream's own files
hold, so the rest of the loader sees one format. A file that pickles any other global fails
with an error naming the file and the global, before anything in it runs.
"""

from __future__ import annotations

import argparse
import pickle
from collections import OrderedDict
from typing import Any, Dict, List

import torch


class _StandIn:
    """Receives a pickled object's `__dict__` (pickle's BUILD); never runs its class's code."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)

    def to_plain(self) -> Any:
        raise NotImplementedError


class LossScalerStandIn(_StandIn):
    """DeepSpeed's static LossScaler: {"dynamic": False, "cur_scale"} as zerostream saves it."""

    def to_plain(self) -> dict:
        return {"dynamic": False, "cur_scale": float(self.__dict__.get("cur_scale", 1.0))}


class DynamicLossScalerStandIn(_StandIn):
    """DeepSpeed's DynamicLossScaler: its trajectory and settings, under the keys of
    zerostream's DynamicLossScaler.state_dict() (both name them alike)."""

    _KEYS = (
        "cur_scale",
        "cur_iter",
        "last_overflow_iter",
        "cur_hysteresis",
        "scale_window",
        "scale_factor",
        "min_scale",
        "delayed_shift",
        "consecutive_hysteresis",
        "raise_error_at_min_scale",
    )

    def to_plain(self) -> dict:
        out = {"dynamic": bool(self.__dict__.get("dynamic", True))}
        out.update({k: self.__dict__[k] for k in self._KEYS if k in self.__dict__})
        return out


class FragmentAddressStandIn(_StandIn):
    """deepspeed.utils.tensor_fragment.fragment_address(numel, start)."""

    def to_plain(self) -> dict:
        return {"numel": int(self.__dict__["numel"]), "start": int(self.__dict__["start"])}


def zero_stage_enum(value) -> int:
    """ZeroStageEnum is pickled as `ZeroStageEnum(value)`: the plain int."""
    stage = int(value)
    if stage not in (0, 1, 2, 3):
        raise pickle.UnpicklingError(f"ZeroStageEnum({value!r}) is not a ZeRO stage")
    return stage


# DeepSpeed's dotted names -> stand-ins. argparse.Namespace (Megatron-style client state)
# is a plain attribute holder; its real class runs no code on unpickling.
DEEPSPEED_GLOBALS: Dict[str, Any] = {
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": LossScalerStandIn,
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": DynamicLossScalerStandIn,
    "deepspeed.runtime.zero.config.ZeroStageEnum": zero_stage_enum,
    "deepspeed.utils.tensor_fragment.fragment_address": FragmentAddressStandIn,
    "argparse.Namespace": argparse.Namespace,
}


def _safe_globals() -> List[tuple]:
    return [(obj, name) for name, obj in DEEPSPEED_GLOBALS.items()]


def to_plain(value: Any) -> Any:
    """`value` with every stand-in replaced by its plain form (containers rebuilt only where
    something inside changed; tensors untouched)."""
    if isinstance(value, _StandIn):
        return value.to_plain()
    if isinstance(value, dict):
        items = [(k, to_plain(v)) for k, v in value.items()]
        if all(new is old for (_, new), old in zip(items, value.values())):
            return value
        return OrderedDict(items) if isinstance(value, OrderedDict) else dict(items)
    if isinstance(value, list):
        new = [to_plain(v) for v in value]
        return value if all(a is b for a, b in zip(new, value)) else new
    if isinstance(value, tuple) and not isinstance(value, torch.Size):
        new = tuple(to_plain(v) for v in value)
        return value if all(a is b for a, b in zip(new, value)) else type(value)(new)
    return value


def _unsafe_globals(path: str) -> List[str]:
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not a zip checkpoint: torch's own message is all there is
        return []
    return [g for g in found if g not in DEEPSPEED_GLOBALS]


class ForbiddenGlobalError(ValueError):
    """A checkpoint file pickles a global that is neither plain data nor a known DeepSpeed
    class; nothing in the file was executed."""


def load(path: str, mmap: bool = False, map_location: str = "cpu") -> Any:
    """torch.load of `path` onto the CPU with weights_only=True plus DeepSpeed's stand-ins,
    returned as plain data (`map_location="meta"`: the structure only, each storage's file
    offset in its `_checkpoint_offset`). Raises ForbiddenGlobalError naming the file and
    the global(s) when the file pickles anything else; other failures propagate
    (files.load_file names the file)."""
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            value = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        unsafe = _unsafe_globals(path)
        if not unsafe:
            raise
        raise ForbiddenGlobalError(
            f"checkpoint file {path} pickles {', '.join(repr(g) for g in unsafe)}, which "
            f"zerostream does not load: only tensors, plain containers and DeepSpeed's "
            f"{', '.join(sorted(DEEPSPEED_GLOBALS))} are read (by stand-ins, without "
            f"importing them). Nothing in the file was executed."
        ) from exc
    return to_plain(value)

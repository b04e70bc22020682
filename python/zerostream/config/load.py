"""ds_config loading: dict, path or base64 text in; a frozen, typed, resolved config out.

Parsing, validation, defaults, "auto" and the batch rule live in the native core
(csrc/config/, the schema in schema.cpp is the only place a key's type, default and allowed
values are written); this module reads the input, calls it once, and turns the resolved tree
into the section dataclasses of sections.py (Note [One config path] in
csrc/config/ds_config.h). Every error names its key path; warnings and "auto" notes are logged
once.
"""

from __future__ import annotations

import base64
import binascii
import collections.abc
import dataclasses
import json
import logging
import math
import os
import typing
from typing import Any, Mapping, Optional, Tuple

from .. import _C
from . import elasticity
from .sections import DeepSpeedConfig
from .zenflow import parse_zenflow

logger = logging.getLogger("zerostream")


# --- reading the input ------------------------------------------------------------------------


def _from_python(config: Mapping) -> dict:
    """A dict as tools build it, made JSON: Accelerate's DeepSpeed plugin always sets
    steps_per_print to float("inf") to mean "never print", which is what null (DeepSpeed's
    default) means here; JSON has no infinity."""
    config = dict(config)
    spp = config.get("steps_per_print")
    if isinstance(spp, float) and math.isinf(spp) and spp > 0:
        config["steps_per_print"] = None
    return config


MAX_DEPTH = 64  # the text reader's limit (csrc/config/json_reader.cpp); DeepSpeed uses ~5


def _too_deep(config: Mapping) -> str:
    """The message for a dict nested past MAX_DEPTH, naming the key path where it does (found
    iteratively: the dict may be deeper than Python's recursion limit)."""
    stack = [(config, [])]
    while stack:
        node, path = stack.pop()
        if len(path) > MAX_DEPTH:
            shown = ".".join(path[:6]) + f"... ({len(path)} keys)"
            return (
                f"DeepSpeed config dict: nested deeper than {MAX_DEPTH} levels of objects and "
                f"lists at key path {shown} (DeepSpeed configs use about 5)"
            )
        items = node.items() if isinstance(node, Mapping) else enumerate(node)
        for k, v in items:
            if isinstance(v, (Mapping, list, tuple)):
                stack.append((v, path + [str(k)]))
    return f"DeepSpeed config dict: nested deeper than {MAX_DEPTH} levels of objects and lists"


def config_text(config: Any) -> Tuple[str, str]:
    """Returns (JSON text, source name) for a dict, a file path or URL-safe base64 text."""
    if isinstance(config, Mapping):
        try:
            return json.dumps(_from_python(config)), "<dict>"
        except (TypeError, ValueError) as exc:
            raise ValueError(f"DeepSpeed config dict is not JSON-serializable: {exc}") from exc
        except RecursionError:
            raise ValueError(_too_deep(config)) from None
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            raise ValueError(f"DeepSpeed config {path!r} is a directory, not a config file")
        # Regular files and what reads like one: /dev/stdin, pipes, <(process substitution).
        if os.path.exists(path):
            with open(path, "r", encoding="utf-8") as f:
                return f.read(), path
        if isinstance(config, str):
            try:
                text = base64.urlsafe_b64decode(config.encode("ascii")).decode("utf-8")
            except (binascii.Error, UnicodeError, ValueError):
                text = None
            if text is not None and text.lstrip().startswith("{"):
                return text, "<base64>"
        raise ValueError(
            f"Expected a string path to an existing deepspeed config, or a dictionary or a "
            f"valid base64 string; got {path!r} (no such file)"
        )
    raise ValueError(
        "Expected a string path to an existing deepspeed config, or a dictionary or a valid "
        f"base64 string; got {type(config).__name__}"
    )


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What the run knows when its config is read (None: unknown): what "auto" values and the
    batch rule are resolved from. validate() and load() take these as keywords."""

    world_size: Optional[int] = None
    train_batch_size: Optional[int] = None
    micro_batch_size: Optional[int] = None
    gradient_accumulation_steps: Optional[int] = None
    hidden_size: Optional[int] = None
    model_dtype: Optional[str] = None
    lr: Optional[float] = None
    total_num_steps: Optional[int] = None

    def native(self, require_batch: bool) -> "_C.RunContext":
        """The native core's RunContext of these facts."""
        ctx = _C.RunContext()
        ctx.require_batch = require_batch
        for f in dataclasses.fields(self):
            setattr(ctx, f.name, getattr(self, f.name))
        return ctx


def validate(config: Any, *, require_batch: bool = False, **known: Any) -> dict:
    """Validates without raising: {"ok", "errors", "warnings", "notes", "tree", "resolved"}.
    `known`: RunFacts' fields (world_size, hidden_size, ...).

    `resolved` maps every key path to {"value", "source"} with source one of
    "file", "default", "auto", "derived". The keys and values only: `zerostream config check`
    (config_check.check) also builds the optimizer and scheduler the config names.
    """
    facts = RunFacts(**known)  # an unknown keyword is a TypeError naming it
    try:
        text, source = config_text(config)
    except ValueError as exc:
        return {
            "ok": False,
            "errors": [str(exc)],
            "warnings": [],
            "notes": [],
            "tree": {},
            "resolved": {},
        }
    result = _C.check_config(text, os.path.basename(source), facts.native(require_batch))
    zero = result.get("tree", {}).get("zero_optimization")
    if isinstance(zero, Mapping):
        try:  # the zenflow section's keys are checked in Python (config/zenflow.py)
            parse_zenflow(zero.get("zenflow"))
        except ValueError as exc:
            result["errors"] = [*result["errors"], str(exc)]
            result["ok"] = False
    return result


# --- the typed tree -----------------------------------------------------------------------------


def _section_class(annotation) -> Optional[type]:
    """The section dataclass an annotation names (`X` or `Optional[X]`), else None."""
    if dataclasses.is_dataclass(annotation):
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(args) == 1 and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


class ReadOnlyMapping(collections.abc.Mapping):
    """A read-only view of a dict's copy, as types.MappingProxyType, that copy.deepcopy and
    pickle can copy (a config is deep-copied by clients: Accelerate, Lightning)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping):
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"ReadOnlyMapping({self._data!r})"

    def __reduce__(self):
        return (ReadOnlyMapping, (self._data,))


def _build(cls, tree: Mapping[str, Any]):
    """Builds section dataclass `cls` from its part of the resolved tree (whose keys are the
    schema's keys); nested sections become their own dataclasses, other mappings read-only."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        if f.name not in tree:
            raise RuntimeError(f"resolved config has no key {f.name!r} for {cls.__name__}")
        value = tree[f.name]
        section = _section_class(hints[f.name])
        if section is not None and isinstance(value, Mapping):
            value = _build(section, value)
        elif isinstance(value, Mapping):
            value = ReadOnlyMapping(dict(value))
        values[f.name] = value
    return cls(**values)


class ConfigError(ValueError, AssertionError):
    """An invalid ds_config, every error listed. An AssertionError too: DeepSpeed asserts
    many of the same rules (batch sizes, bucket sizes), and code written against it catches
    that type."""


def build_config(tree: Mapping[str, Any]) -> DeepSpeedConfig:
    """The typed config of a resolved tree (load's, or validate's "tree"); no checks of its
    own: the tree is what the native reader resolved."""
    tree = dict(tree)
    tree.pop("bfloat16", None)  # DeepSpeed's old name of bf16, already resolved into bf16
    cfg = _build(DeepSpeedConfig, tree)
    # The zenflow section's keys are checked here, not in the native schema (config/zenflow.py).
    zero = cfg.zero_optimization
    zenflow = parse_zenflow(zero.zenflow)
    return dataclasses.replace(cfg, zero_optimization=dataclasses.replace(zero, zenflow=zenflow))


def load(
    config: Any, *, require_batch: bool = True, log: bool = True, **known: Any
) -> DeepSpeedConfig:
    """Loads, validates and resolves a ds_config. Raises ConfigError (a ValueError)
    listing every error. `known`: RunFacts' fields (world_size, hidden_size, ...)."""
    facts = RunFacts(**known)
    text, source = config_text(config)
    raw = _C.read_json_text(text, source)
    # An enabled `elasticity` section sets the batch keys for this world (elasticity.py).
    elastic = elasticity.resolve_batch(raw, facts.world_size or 1)
    if elastic is not None:
        raw, text = elastic, json.dumps(elastic)
    context = facts.native(require_batch)
    try:
        res = _C.load_config(text, os.path.basename(source), context)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        built = build_config(res["tree"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    cfg = dataclasses.replace(
        built,
        data_parallel_size=res["data_parallel_size"],
        raw=ReadOnlyMapping(raw),
        resolved=ReadOnlyMapping(res["resolved"]),
        warnings=tuple(res["warnings"]),
        notes=tuple(res["notes"]),
    )
    if log:
        # Formatted here: code that patches logger.warning (DeepSpeed's tests) reads the text.
        for w in cfg.warnings:
            logger.warning("ds_config: " + w)
        for n in cfg.notes:
            logger.info("ds_config: " + n)
    return cfg

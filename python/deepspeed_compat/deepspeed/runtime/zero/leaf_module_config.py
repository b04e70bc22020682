"""`deepspeed.runtime.zero.leaf_module_config`: the `zero_optimization.leaf_module` section
(Note [Leaf modules] in zerostream/zero/stage3/leaf.py): its defaults, DeepSpeed's, and the
section as a DeepSpeedConfigModel (a string stands for a one-item list, entries are
deduplicated in order)."""

from __future__ import annotations

from typing import List

from pydantic import Field, field_validator

from zerostream.zero.stage3.leaf import DEFAULT_CLASSES

from ..config_utils import DeepSpeedConfigModel

DEFAULT_LEAF_MODULE_CLASSES: List[str] = list(DEFAULT_CLASSES)
DEFAULT_LEAF_MODULE_NAMES: List[str] = []
DEFAULT_LEAF_MODULE_NAME_SUFFIXES: List[str] = []


class DeepSpeedZeroLeafModuleConfig(DeepSpeedConfigModel):
    classes: List[str] = Field(default_factory=lambda: list(DEFAULT_LEAF_MODULE_CLASSES))
    names: List[str] = Field(default_factory=lambda: list(DEFAULT_LEAF_MODULE_NAMES))
    name_suffixes: List[str] = Field(
        default_factory=lambda: list(DEFAULT_LEAF_MODULE_NAME_SUFFIXES)
    )

    @field_validator("classes", "names", "name_suffixes", mode="before")
    @classmethod
    def _as_list(cls, value):
        items = [value] if isinstance(value, str) else value
        return list(dict.fromkeys(items)) if isinstance(items, (list, tuple)) else items


__all__ = [
    "DEFAULT_LEAF_MODULE_CLASSES",
    "DEFAULT_LEAF_MODULE_NAMES",
    "DEFAULT_LEAF_MODULE_NAME_SUFFIXES",
    "DeepSpeedZeroLeafModuleConfig",
]

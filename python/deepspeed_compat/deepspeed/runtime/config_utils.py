"""`deepspeed.runtime.config_utils`: DeepSpeedConfigModel, the pydantic base DeepSpeed's config
sections (and code built on DeepSpeed, which subclasses it for its own sections) derive
from, and the dict helpers DeepSpeed's config reader uses.

DeepSpeedConfigModel's rules, as DeepSpeed's:
- unknown keys are a ValidationError (extra="forbid"); a field may be given by its name or
  its alias; assignments are validated;
- unless `strict=True`, a value "auto" is dropped (the field keeps its default): "auto" is
  what HF Accelerate and the Trainer leave for values they fill in later;
- a field whose `json_schema_extra` has `deprecated: True` logs a warning when given; with
  `new_param` (a field name, dotted for a nested section) the value, passed through
  `new_param_fn`, is set there unless `set_new_param` is False; giving both the deprecated
  field and its replacement is an AssertionError.
"""

from __future__ import annotations

import collections
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..utils.logging import logger


class DeepSpeedConfigModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        validate_default=True,
        validate_assignment=True,
        use_enum_values=True,
        populate_by_name=True,
        arbitrary_types_allowed=True,
        protected_namespaces=(),
    )

    def __init__(self, strict: bool = False, **data: Any):
        if not strict:
            data = {k: v for k, v in data.items() if not (v == "auto" and k != "replace_method")}
        super().__init__(**data)
        self._apply_deprecated_fields()

    def _apply_deprecated_fields(self) -> None:
        for name, field in type(self).model_fields.items():
            extra = field.json_schema_extra
            if not isinstance(extra, dict) or not extra.get("deprecated", False):
                continue
            if name not in self.model_fields_set:
                continue
            new = extra.get("new_param", "")
            note = extra.get("deprecated_msg", "")
            logger.warning(
                f"Config parameter {name} is deprecated"
                + (f"; use {new} instead" if new else "")
                + (f". {note}" if note else "")
            )
            if not new or not extra.get("set_new_param", True):
                continue
            *path, leaf = new.split(".")
            owner = self
            for part in path:
                owner = getattr(owner, part)
            if leaf in owner.model_fields_set:
                raise AssertionError(
                    f"Cannot provide deprecated parameter '{name}' and replacing parameter "
                    f"'{new}' together"
                )
            value = extra.get("new_param_fn", lambda x: x)(getattr(self, name))
            setattr(owner, leaf, value)


def get_scalar_param(param_dict: dict, param_name: str, param_default_value: Any) -> Any:
    return param_dict.get(param_name, param_default_value)


def get_list_param(param_dict: dict, param_name: str, param_default_value: Any) -> Any:
    return param_dict.get(param_name, param_default_value)


def get_dict_param(param_dict: dict, param_name: str, param_default_value: Any) -> Any:
    return param_dict.get(param_name, param_default_value)


def dict_raise_error_on_duplicate_keys(ordered_pairs):
    """json.load's object_pairs_hook that refuses a key given twice (DeepSpeed's)."""
    counts = collections.Counter(k for k, _ in ordered_pairs)
    repeated = sorted(k for k, n in counts.items() if n > 1)
    if repeated:
        raise ValueError(f"Duplicate keys in DeepSpeed config: {repeated}")
    return dict(ordered_pairs)


__all__ = [
    "DeepSpeedConfigModel",
    "dict_raise_error_on_duplicate_keys",
    "get_dict_param",
    "get_list_param",
    "get_scalar_param",
]

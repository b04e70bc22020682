"""`deepspeed.runtime.precision_config`: the `bf16` and `fp16` sections read alone
(`get_bfloat16_config(ds_config_dict)`, `get_float16_config(...)`, `DeepSpeedFP16Config(**fp16)`),
validated by zerostream's schema and returned as its section objects (fields named as the JSON
keys, defaults filled; DeepSpeed's old key "bfloat16" is read when "bf16" is absent)."""

from __future__ import annotations

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from zerostream import config as _config

BFLOAT16 = "bf16"
BFLOAT16_OLD = "bfloat16"
FP16 = "fp16"


def _section(param_dict: dict, key: str):
    section = param_dict.get(key)
    if section is None and key == BFLOAT16:
        section = param_dict.get(BFLOAT16_OLD)
    resolved = _config.load({"train_micro_batch_size_per_gpu": 1, key: section or {}}, world_size=1)
    return getattr(resolved, key)


def get_bfloat16_config(param_dict: dict):
    return _section(param_dict, BFLOAT16)


def get_float16_config(param_dict: dict):
    return _section(param_dict, FP16)


class _FP16Type(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _config.FP16Config)


class DeepSpeedFP16Config(metaclass=_FP16Type):
    """`DeepSpeedFP16Config(**fp16_section)`: zerostream's FP16Config for the section, every
    key checked by the schema (loss_scale a finite number >= 0, loss_scale_window and
    min_loss_scale > 0 with dynamic scaling). An invalid section raises pydantic's
    ValidationError, as DeepSpeed's pydantic model does, with zerostream's message naming the
    key."""

    def __new__(cls, **section):
        try:
            return _section({FP16: section}, FP16)
        except ValueError as exc:  # ConfigError, or a value JSON cannot hold (inf, nan)
            detail = PydanticCustomError("value_error", "{why}", {"why": str(exc)})
            raise ValidationError.from_exception_data(
                cls.__name__, [{"type": detail, "loc": (FP16,), "input": section}]
            ) from None


__all__ = ["DeepSpeedFP16Config", "get_bfloat16_config", "get_float16_config"]

"""`deepspeed.runtime.zero.config`: the ZeRO stage enum and the `zero_optimization` section
classes by DeepSpeed's names.

`DeepSpeedZeroConfig(**section)`, `DeepSpeedZeroOffloadParamConfig(**section)` and
`DeepSpeedZeroOffloadOptimizerConfig(**section)` validate a partial section with zerostream's
schema (defaults filled, DeepSpeed's deprecated keys mapped, unknown keys refused by name) and
return it read-only. Fields answer to DeepSpeed's pydantic field names as well as to the
JSON keys: DeepSpeed names `stage3_prefetch_bucket_size` `prefetch_bucket_size` in Python,
and so on for every `stage3_` key. `isinstance` holds for these objects and for the sections
of a config initialize() resolved (`engine.config.zero_optimization`).
"""

from __future__ import annotations

import enum

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from zerostream import config as _config
from zerostream.zero.stage3.leaf import leaf_config


class ZeroStageEnum(enum.IntEnum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


class _SectionView:
    """A resolved section read by JSON key or by DeepSpeed's field name (`stage3_` dropped);
    nested sections come back as views too."""

    __slots__ = ("_section",)

    def __init__(self, section):
        object.__setattr__(self, "_section", section)

    def __getattr__(self, name: str):
        section = object.__getattribute__(self, "_section")
        if name == "leaf_module" and hasattr(section, "leaf_module"):
            return leaf_config(section.leaf_module)  # classes, names, name_suffixes
        for key in (name, f"stage3_{name}"):
            if hasattr(section, key):
                value = getattr(section, key)
                if hasattr(value, "__dataclass_fields__"):
                    return _SectionView(value)
                return value
        raise AttributeError(f"{type(section).__name__} has no field {name!r}")

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(
            f"a resolved zero_optimization section is read-only (setting {name!r}); build a "
            "new one from the section dict"
        )

    def __eq__(self, other) -> bool:
        return self._section == getattr(other, "_section", other)

    def __repr__(self) -> str:
        return repr(self._section)


def _resolve_zero(section: dict):
    resolved = _config.load(
        {"train_micro_batch_size_per_gpu": 1, "zero_optimization": dict(section)}, world_size=1
    )
    return resolved.zero_optimization


class _SectionClass(type):
    """Metaclass: calling the class validates a partial section; isinstance accepts
    zerostream's section object and views of it."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(getattr(obj, "_section", obj), cls._zs_type)

    def __call__(cls, **section):
        try:
            return _SectionView(cls._read(section))
        except _config.ConfigError as exc:
            # DeepSpeed's section classes are pydantic models: a bad value is pydantic's
            # ValidationError (a ValueError too), here with zerostream's message naming the key.
            detail = PydanticCustomError("value_error", "{why}", {"why": str(exc)})
            raise ValidationError.from_exception_data(
                cls.__name__, [{"type": detail, "loc": ("zero_optimization",), "input": section}]
            ) from None


class DeepSpeedZeroConfig(metaclass=_SectionClass):
    _zs_type = _config.ZeroConfig

    @staticmethod
    def _read(section):
        return _resolve_zero(section)


class DeepSpeedZeroOffloadParamConfig(metaclass=_SectionClass):
    _zs_type = _config.OffloadParamConfig

    @staticmethod
    def _read(section):
        return _resolve_zero({"stage": 3, "offload_param": section}).offload_param


class DeepSpeedZeroOffloadOptimizerConfig(metaclass=_SectionClass):
    _zs_type = _config.OffloadOptimizerConfig

    @staticmethod
    def _read(section):
        # Checked as at stage 3, where every key of the section is allowed (`ratio` below 1,
        # ZeRO-Offload++, is stage 3's); DeepSpeed's class checks the section alone.
        return _resolve_zero({"stage": 3, "offload_optimizer": section}).offload_optimizer


__all__ = [
    "DeepSpeedZeroConfig",
    "DeepSpeedZeroOffloadOptimizerConfig",
    "DeepSpeedZeroOffloadParamConfig",
    "ZeroStageEnum",
]

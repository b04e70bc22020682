"""`deepspeed.runtime.zenflow.zenflow_config`: ZenFlowConfig, the `zero_optimization.zenflow`
section. `ZenFlowConfig(**section)` checks the keys with zerostream's rules
(zerostream/config/zenflow.py; an invalid section is pydantic's ValidationError, as
DeepSpeed's model raises) and returns the frozen section; `isinstance` holds for it and for
the section of a resolved config, however it is viewed."""

from __future__ import annotations

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from zerostream.config import zenflow as _zenflow


class _ZenFlowType(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(getattr(obj, "_section", obj), _zenflow.ZenFlowConfig)

    def __call__(cls, **section):
        try:
            return _zenflow.parse_zenflow(section)
        except ValueError as exc:
            detail = PydanticCustomError("value_error", "{why}", {"why": str(exc)})
            raise ValidationError.from_exception_data(
                cls.__name__, [{"type": detail, "loc": ("zenflow",), "input": section}]
            ) from None


class ZenFlowConfig(metaclass=_ZenFlowType):
    """DeepSpeed's ZenFlow section class (see the module's docstring)."""


__all__ = ["ZenFlowConfig"]

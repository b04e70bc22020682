"""`deepspeed.runtime.precision_config`: the `bf16` and `fp16` sections read alone
(`get_bfloat16_config(ds_config_dict)`, `get_float16_config(...)`), validated by zerostream's
schema and returned as its section objects (fields named as the JSON keys, defaults filled;
DeepSpeed's old key "bfloat16" is read when "bf16" is absent)."""

from __future__ import annotations

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


__all__ = ["get_bfloat16_config", "get_float16_config"]

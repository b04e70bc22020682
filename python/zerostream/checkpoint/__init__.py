"""Checkpoints in DeepSpeed's layout (reference §3): save, load, resharding, zero_to_fp32."""

from .load import load_checkpoint
from .save import save_checkpoint
from .zero_to_fp32 import (
    convert_zero_checkpoint_to_fp32_state_dict,
    get_fp32_state_dict_from_zero_checkpoint,
    load_state_dict_from_zero_checkpoint,
)

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "get_fp32_state_dict_from_zero_checkpoint",
    "convert_zero_checkpoint_to_fp32_state_dict",
    "load_state_dict_from_zero_checkpoint",
]

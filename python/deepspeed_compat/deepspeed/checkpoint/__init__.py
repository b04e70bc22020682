"""`deepspeed.checkpoint`: helpers tools use around checkpoints (utils), the layout's key
strings (constants) and the universal-checkpoint converter (ds_to_universal)."""

from . import constants, utils
from .constants import *  # noqa: F403  (DeepSpeed's package exports them all)
from .utils import get_model_ckpt_name_for_rank, get_zero_ckpt_name_for_rank

__all__ = ["constants", "utils", "get_model_ckpt_name_for_rank", "get_zero_ckpt_name_for_rank"]
__all__ += [k for k in dir(constants) if k.isupper()]

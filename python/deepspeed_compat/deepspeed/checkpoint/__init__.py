"""`deepspeed.checkpoint`: helpers tools use around checkpoints (utils)."""

from . import utils

__all__ = ["utils"]

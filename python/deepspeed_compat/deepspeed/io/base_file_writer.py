"""`deepspeed.io.base_file_writer` (zerostream.checkpoint.file_writer)."""

from zerostream.checkpoint.file_writer import BASE_STAT_KEYS, BaseFileWriter

from .constants import *  # noqa: F403 - DeepSpeed's module exposes its constants too
from .constants import __all__ as _constants

__all__ = ["BASE_STAT_KEYS", "BaseFileWriter", *_constants]

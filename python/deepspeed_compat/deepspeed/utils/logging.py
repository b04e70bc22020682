"""`deepspeed.utils.logging`: the logger and `log_dist`, at DeepSpeed's path.

`logger` is zerostream's own logger, so setting DeepSpeed's log level (PyTorch Lightning's
`DeepSpeedStrategy(logging_level=...)`, the Hugging Face Trainer from its own level) sets
zerostream's.
"""

from __future__ import annotations

import logging as _logging
from typing import Iterable, Optional

from zerostream import comm

logger = _logging.getLogger("zerostream")


def log_dist(message: str, ranks: Optional[Iterable[int]] = None, level: int = _logging.INFO):
    """Logs `message` on the listed ranks (all with -1 in the list; rank 0 when None)."""
    ranks = [0] if ranks is None else list(ranks)
    rank = comm.get_rank()
    if -1 in ranks or rank in ranks:
        logger.log(level, "[Rank %d] %s", rank, message)


LOG_LEVELS = {
    "debug": _logging.DEBUG,
    "info": _logging.INFO,
    "warning": _logging.WARNING,
    "error": _logging.ERROR,
    "critical": _logging.CRITICAL,
}


def get_log_level_from_string(log_level_str: str) -> int:
    """ "info" -> logging.INFO; ValueError naming the valid levels otherwise."""
    level = LOG_LEVELS.get(str(log_level_str).lower())
    if level is None:
        raise ValueError(
            f"{log_level_str!r} is not a logging level; valid levels: {', '.join(LOG_LEVELS)}"
        )
    return level


def set_log_level_from_string(log_level_str: str, custom_logger=None) -> None:
    """Sets `custom_logger` (DeepSpeed's logger, zerostream's, when None) and its handlers
    to the level named by `log_level_str` ("debug", "info", "warning", "error", "critical")."""
    level = get_log_level_from_string(log_level_str)
    target = logger if custom_logger is None else custom_logger
    target.setLevel(level)
    for handler in target.handlers:
        handler.setLevel(level)


__all__ = [
    "get_log_level_from_string",
    "log_dist",
    "logger",
    "set_log_level_from_string",
]

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


__all__ = ["logger", "log_dist"]

"""`deepspeed.utils.pin_memory_tracker`: the process's running total of memory pinned through
the accelerator's `pin_memory` (zerostream.offload.pin_tally), reported on DeepSpeed's
logger name ("DeepSpeed", not propagating, as DeepSpeed's), which writes through
zerostream's handlers once this module is imported."""

from __future__ import annotations

import logging

from zerostream.offload.pin_tally import fmt_bytes as _fmt_bytes
from zerostream.offload.pin_tally import tally


def _deepspeed_logger() -> logging.Logger:
    log = logging.getLogger("DeepSpeed")
    if not log.handlers:  # DeepSpeed's own logger does not propagate either
        ours = logging.getLogger("zerostream")
        for handler in ours.handlers:
            log.addHandler(handler)
        log.setLevel(ours.level)
        log.propagate = False
    return log


_tracker = tally()
_tracker.logger = _deepspeed_logger()


def track_pinned_memory(num_bytes: int) -> None:
    _tracker.track(num_bytes)


def pinned_memory_summary(tag: str = "") -> None:
    _tracker.log_summary(tag)


__all__ = ["_fmt_bytes", "_tracker", "pinned_memory_summary", "track_pinned_memory"]

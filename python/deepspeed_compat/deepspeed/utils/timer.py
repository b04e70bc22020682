"""`deepspeed.utils.timer`: `trim_mean`, the outlier-trimmed mean the comms summary prints."""

from zerostream.comm.comms_logging import trim_mean

__all__ = ["trim_mean"]

"""`deepspeed.monitor.comet`: zerostream's Comet writer."""

from zerostream.monitor import CometMonitor

__all__ = ["CometMonitor"]

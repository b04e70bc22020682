"""`deepspeed.runtime.dataloader`: RepeatingLoader (zerostream/data.py)."""

from zerostream.data import RepeatingLoader

__all__ = ["RepeatingLoader"]

"""`deepspeed.utils.init_on_device`: OnDevice (zerostream/on_device.py)."""

from zerostream.on_device import OnDevice

__all__ = ["OnDevice"]

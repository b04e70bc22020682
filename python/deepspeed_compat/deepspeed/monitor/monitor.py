"""`deepspeed.monitor.monitor`: the writer interface and MonitorMaster (zerostream's)."""

from zerostream.monitor import Monitor, MonitorMaster

__all__ = ["Monitor", "MonitorMaster"]

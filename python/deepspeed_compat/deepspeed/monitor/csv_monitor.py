"""`deepspeed.monitor.csv_monitor`: zerostream's CSV writer, under DeepSpeed's class name."""

from zerostream.monitor import CsvMonitor as csvMonitor

__all__ = ["csvMonitor"]

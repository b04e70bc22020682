"""`deepspeed.monitor.tensorboard`: zerostream's TensorBoard writer."""

from zerostream.monitor import TensorBoardMonitor

__all__ = ["TensorBoardMonitor"]

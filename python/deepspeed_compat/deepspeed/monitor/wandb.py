"""`deepspeed.monitor.wandb`: zerostream's Weights & Biases writer."""

from zerostream.monitor import WandbMonitor

__all__ = ["WandbMonitor"]

"""`deepspeed.monitor`: the writers of the `tensorboard`, `csv_monitor`, `wandb` and `comet`
sections, zerostream's (zerostream/monitor/), under DeepSpeed's module names."""

from . import comet, config, csv_monitor, monitor, tensorboard, utils, wandb  # noqa: F401

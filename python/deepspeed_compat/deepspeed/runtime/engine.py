"""`deepspeed.runtime.engine`: DeepSpeedEngine is zerostream's ZeroEngine (the class
initialize() returns, so isinstance checks and unwrapping by tools hold)."""

from typing import Callable, Iterable, Union

import torch

from zerostream.engine import ZeroEngine as DeepSpeedEngine

DeepSpeedOptimizerCallable = Callable[
    [Union[Iterable[torch.nn.Parameter], dict]], torch.optim.Optimizer
]
DeepSpeedSchedulerCallable = Callable[[torch.optim.Optimizer], object]

__all__ = ["DeepSpeedEngine", "DeepSpeedOptimizerCallable", "DeepSpeedSchedulerCallable"]

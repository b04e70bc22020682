"""`deepspeed.runtime.base_optimizer`: the classes DeepSpeed's wrapped optimizers derive
from, for `isinstance` checks (PyTorch Lightning's Fabric asks whether a state entry is a
`DeepSpeedOptimizer` before saving it).

Every optimizer `deepspeed.initialize` returns on zerostream is a ZeRO optimizer wrapper
(stage 0 included), so both names are that wrapper's base class.
"""

from zerostream.zero.base import ZeroOptimizerBase

DeepSpeedOptimizer = ZeroOptimizerBase
ZeROOptimizer = ZeroOptimizerBase

__all__ = ["DeepSpeedOptimizer", "ZeROOptimizer"]

"""`deepspeed.profiling.flops_profiler`: DeepSpeed's flops profiler on zerostream's
(zerostream/profiling/flops_profiler.py), with its number formats; the names are
`profiler.py`'s, where DeepSpeed's engine imports them from."""

from .profiler import *  # noqa: F403
from .profiler import __all__  # noqa: F401

"""`deepspeed.runtime.activation_checkpointing.checkpointing`: the same module as
`deepspeed.checkpointing` (DeepSpeed's own path for it)."""

from ...checkpointing import *  # noqa: F403
from ...checkpointing import __all__  # noqa: F401

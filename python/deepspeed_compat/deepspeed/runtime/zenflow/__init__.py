"""`deepspeed.runtime.zenflow`: ZenFlow's config class and helpers by DeepSpeed's module names;
the runtime is zerostream's (zerostream/zero/zenflow/)."""

from . import zenflow_config, zenflow_utils

__all__ = ["zenflow_config", "zenflow_utils"]

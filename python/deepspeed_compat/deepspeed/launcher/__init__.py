"""`deepspeed.launcher`: the `deepspeed` command is zerostream's launcher (runner)."""

from . import runner

__all__ = ["runner"]

"""`deepspeed.launcher`: the `deepspeed` command is zerostream's launcher (runner); the
multi-node runners build their command lines with zerostream's cluster launchers."""

from . import constants, multinode_runner, runner

__all__ = ["constants", "multinode_runner", "runner"]

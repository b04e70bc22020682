"""`deepspeed.checkpointing`: activation checkpointing (zerostream/activation_checkpointing.py).
PyTorch Lightning calls `configure` whenever its config has an `activation_checkpointing`
section (its default config does) and models call `checkpoint` around blocks."""

from zerostream.activation_checkpointing import *  # noqa: F403
from zerostream.activation_checkpointing import __all__  # noqa: F401

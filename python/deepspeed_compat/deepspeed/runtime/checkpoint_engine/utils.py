"""`deepspeed.runtime.checkpoint_engine.utils` (zerostream.checkpoint.checkpoint_engines)."""

from zerostream.checkpoint.checkpoint_engines import create_checkpoint_engine

__all__ = ["create_checkpoint_engine"]

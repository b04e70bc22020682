"""The engine `zerostream.initialize` returns: DeepSpeed's training loop (engine.py) and the
collaborators it holds, each about one thing (accessors.py: the config's answers by
DeepSpeed's names; checkpoints.py: save and load; unsupported.py: what it refuses up front).
`zerostream.engine.ZeroEngine` and `NoSyncError` are the public names (DeepSpeed's
`deepspeed.runtime.engine.DeepSpeedEngine` is ZeroEngine)."""

from .engine import NoSyncError, ZeroEngine

__all__ = ["NoSyncError", "ZeroEngine"]

"""`deepspeed.runtime.activation_checkpointing`: where DeepSpeed keeps `checkpointing` and
`offload_activations`."""

from . import checkpointing, offload_activations

__all__ = ["checkpointing", "offload_activations"]

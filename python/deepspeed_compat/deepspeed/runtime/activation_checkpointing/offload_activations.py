"""`deepspeed.runtime.activation_checkpointing.offload_activations`: the hidden states of
gradient-checkpointed layers parked in host memory
(zerostream/activation_checkpointing/hidden_states.py, Note [Parked hidden states])."""

from zerostream.activation_checkpointing.hidden_states import (
    CheckpointActivationOffloadStats,
    CheckpointHiddenStatesOffload,
    get_checkpoint_hidden_states_offloading_ctx_manager,
)

__all__ = [
    "CheckpointActivationOffloadStats",
    "CheckpointHiddenStatesOffload",
    "get_checkpoint_hidden_states_offloading_ctx_manager",
]

"""`deepspeed.runtime.zero.offload_states`: where a ZeRO engine's state kinds are now
(`engine.offload_states` / `reload_states` move them; zerostream/zero/state_offload.py)."""

from zerostream.zero.state_offload import state_devices


def get_state_devices(model, state):
    """The set of devices the tensors of `state` (an OffloadStateTypeEnum) are on."""
    return state_devices(model, state)


__all__ = ["get_state_devices"]

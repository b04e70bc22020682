"""`deepspeed.utils.pin_memory`: DeepSpeed's choice of pinned-memory backend
(`DS_PIN_MEMORY_BACKEND`: "torch", the default, or "native", its own pin_memory op).

zerostream has no native pinning op to offer DeepSpeed's callers (its offload engine pins
its own host memory in arenas, registered once): with the default the accelerator's
`pin_memory` is torch's, and asking for "native" fails here, naming the op, instead of
quietly pinning through torch, as DeepSpeed fails when its op cannot be built."""

from __future__ import annotations

import os

_shared_native_pins = None  # DeepSpeed's shared manager; never built here


def _native_requested() -> bool:
    return os.environ.get("DS_PIN_MEMORY_BACKEND", "torch").strip().lower() == "native"


def get_native_pinned_memory():
    from deepspeed.ops import op_builder

    try:
        op_builder.PinMemoryBuilder().load()
    except Exception as exc:
        raise RuntimeError(
            "DS_PIN_MEMORY_BACKEND=native requires DeepSpeed's pin_memory op, which zerostream "
            "does not build; unset DS_PIN_MEMORY_BACKEND (torch pinning) - zerostream's "
            "offload pins its own host memory"
        ) from exc
    raise RuntimeError("DS_PIN_MEMORY_BACKEND=native: the pin_memory op is not available")


def get_active_native_pinned_memory():
    """The native manager when DS_PIN_MEMORY_BACKEND=native (here: RuntimeError, the op is
    not built), else None (torch pinning)."""
    if not _native_requested():
        return None
    if _shared_native_pins is not None:
        return _shared_native_pins
    return get_native_pinned_memory()


__all__ = ["get_active_native_pinned_memory", "get_native_pinned_memory"]

"""`deepspeed.runtime.utils`: helpers scripts import from DeepSpeed's runtime."""

from __future__ import annotations

from typing import Any

import torch


def move_to_device(item: Any, device, criterion_func=None) -> Any:
    """`item` with every tensor inside dicts, lists and tuples moved to `device` (only those
    for which `criterion_func(tensor)` is true, when given)."""
    if torch.is_tensor(item):
        if criterion_func is None or criterion_func(item):
            return item.to(device)
        return item
    if isinstance(item, dict):
        return type(item)((k, move_to_device(v, device, criterion_func)) for k, v in item.items())
    if isinstance(item, (list, tuple)):
        moved = [move_to_device(v, device, criterion_func) for v in item]
        return type(item)(*moved) if hasattr(item, "_fields") else type(item)(moved)
    return item


def see_memory_usage(message: str, force: bool = False) -> None:
    """Prints `message`, the accelerator's allocated bytes and the host's used memory, on
    rank 0 and only with `force` (DeepSpeed's contract: callers leave it in code and turn it
    on by hand)."""
    import gc

    import psutil

    from zerostream import comm
    from zerostream.accelerator import get_accelerator

    if not force or (comm.is_initialized() and comm.get_rank() != 0):
        return
    gc.collect()
    gib = 1024**3
    vm = psutil.virtual_memory()
    print(message)
    print(f"MA {get_accelerator().memory_allocated() / gib:.2f} GB")
    used = (vm.total - vm.available) / gib
    print(f"CPU Virtual Memory:  used = {used:.2f} GB, percent = {vm.percent}%")


def call_to_str(base: str, *args, **kwargs) -> str:
    """`base(arg, ..., key=value, ...)` with each value's repr (DeepSpeed's helper)."""
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{base}({', '.join(parts)})"


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2, mpu=None):
    """Clips the gradients of `parameters` in place to a total norm of at most `max_norm`;
    returns the total norm before clipping. With `mpu` (model parallelism) refused by name:
    zerostream has no model-parallel groups."""
    if mpu is not None:
        raise NotImplementedError(
            "deepspeed.runtime.utils.clip_grad_norm_(mpu=...): zerostream has no model "
            "parallelism; call it without mpu"
        )
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

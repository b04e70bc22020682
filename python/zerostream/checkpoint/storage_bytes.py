"""Bytes of tensors and storages for the file writers (DeepSpeed's `deepspeed.io.utils`).

A writer's `save_torch_storage_object_list` is handed what torch's serializer keeps per
storage: a `(UntypedStorage, dtype)` pair since torch 1.12, the typed storage itself before.
`storage_details` says, for either form, where the bytes are, their dtype, how many elements
they hold and how many bytes; the writers write exactly `nbytes` of them (plus, when asked,
the element count as an 8-byte little-endian integer in front, `STORAGE_SIZE_BYTES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

# The element count written in front of a storage's bytes when `save_size` is set.
STORAGE_SIZE_BYTES = 8


@dataclass
class SerializeDetails:
    """One storage to write: `obj` holds the bytes, `size` counts elements of `dtype`,
    `nbytes` counts bytes."""

    obj: Any
    dtype: torch.dtype
    size: int
    nbytes: int


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    """The bytes of a CPU tensor, as stored (any dtype, bf16 included)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def bytes_to_tensor(buffer) -> torch.Tensor:
    """A uint8 CPU tensor holding a copy of `buffer` (bytes, bytearray, memoryview)."""
    view = memoryview(buffer).cast("B")
    out = torch.empty(len(view), dtype=torch.uint8)
    if len(view):
        out.numpy()[:] = view
    return out


def required_minimum_torch_version(major_version: int, minor_version: int) -> bool:
    """Whether the running torch is at least `major_version.minor_version`."""
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    return (major, minor) >= (major_version, minor_version)


def storage_details(storage_obj) -> SerializeDetails:
    """Details of a `(UntypedStorage, dtype)` pair, or of a typed storage (older torch's
    form: `element_size()` and `size()` in elements)."""
    if isinstance(storage_obj, tuple):
        if len(storage_obj) != 2 or not isinstance(storage_obj[1], torch.dtype):
            raise ValueError(
                "storage object: expected a (storage, dtype) pair; got a tuple of "
                f"{len(storage_obj)} ({', '.join(type(x).__name__ for x in storage_obj)})"
            )
        obj, dtype = storage_obj
        nbytes = int(obj.nbytes())
        per_element = torch.empty((), dtype=dtype).element_size()
        return SerializeDetails(obj=obj, dtype=dtype, size=nbytes // per_element, nbytes=nbytes)
    if isinstance(storage_obj, torch.TypedStorage):
        count = storage_obj.size()
        nbytes = count * storage_obj.element_size()
        return SerializeDetails(
            obj=storage_obj._untyped_storage, dtype=storage_obj.dtype, size=count, nbytes=nbytes
        )
    raise ValueError(
        "storage object: expected a (torch.UntypedStorage, torch.dtype) pair or a "
        f"torch.TypedStorage; got {type(storage_obj).__name__}"
    )


def obj_serialization_details() -> Callable[[Any], SerializeDetails]:
    """DeepSpeed's accessor: the function that reads a storage object of this torch."""
    return storage_details


def storage_byte_tensors(storage_obj_list, save_size: bool) -> list[torch.Tensor]:
    """The uint8 tensors a storage list is written as, in order: for each storage its
    element count (when `save_size`) and its bytes, on the storage's device."""
    out = []
    for item in storage_obj_list:
        d = storage_details(item)
        if save_size:
            out.append(torch.tensor([d.size], dtype=torch.int64).view(torch.uint8))
        data = torch.empty(0, dtype=torch.uint8, device=d.obj.device)
        out.append(data.set_(d.obj, 0, (d.nbytes,), (1,)))
    return out


def writer_slice(total: int, writers: int, rank: int) -> tuple[int, int]:
    """[start, end) of the `total` bytes that writer `rank` of `writers` writes: equal
    shares, the first `total % writers` writers one byte more."""
    if writers < 1 or not 0 <= rank < writers:
        raise ValueError(
            f"num_parallel_writers={writers}, writer_rank={rank}: expected "
            "0 <= writer_rank < num_parallel_writers"
        )
    share, extra = divmod(total, writers)
    start = rank * share + min(rank, extra)
    return start, start + share + (1 if rank < extra else 0)


# DeepSpeed's names.
serialize_details = SerializeDetails

__all__ = [
    "STORAGE_SIZE_BYTES",
    "SerializeDetails",
    "serialize_details",
    "tensor_to_bytes",
    "bytes_to_tensor",
    "required_minimum_torch_version",
    "storage_details",
    "obj_serialization_details",
    "storage_byte_tensors",
    "writer_slice",
]

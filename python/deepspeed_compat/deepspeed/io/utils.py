"""`deepspeed.io.utils` (zerostream.checkpoint.storage_bytes)."""

from zerostream.checkpoint.storage_bytes import (
    bytes_to_tensor,
    obj_serialization_details,
    required_minimum_torch_version,
    serialize_details,
    tensor_to_bytes,
)

__all__ = [
    "bytes_to_tensor",
    "obj_serialization_details",
    "required_minimum_torch_version",
    "serialize_details",
    "tensor_to_bytes",
]

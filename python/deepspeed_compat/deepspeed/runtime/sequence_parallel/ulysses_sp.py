"""Refused on import: Accelerate and Trainer import this module only when sequence
parallelism is configured (parallelism_config sp_backend "deepspeed", sp_size > 1)."""

from ..._unsupported import SEQUENCE_PARALLELISM, unsupported

raise unsupported(
    SEQUENCE_PARALLELISM,
    "deepspeed.runtime.sequence_parallel.ulysses_sp",
    "set sp_size to 1 (zerostream trains with ZeRO data parallelism only)",
)

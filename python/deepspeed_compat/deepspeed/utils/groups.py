"""`deepspeed.utils.groups`: the parallel groups of a run. zerostream has data parallelism
only: its group is the world; model, tensor and sequence parallel worlds have size 1, and
asking for a sequence-parallel group is refused."""

from __future__ import annotations

from zerostream import comm

from .._unsupported import SEQUENCE_PARALLELISM, unsupported


def _get_data_parallel_group():
    return comm.get_world_group()


def _get_data_parallel_world_size() -> int:
    return comm.get_world_size()


def _get_data_parallel_rank() -> int:
    return comm.get_rank()


def _get_model_parallel_world_size() -> int:
    return 1


def _get_sequence_parallel_world_size() -> int:
    return 1


def _get_sequence_parallel_rank() -> int:
    return 0


def _get_sequence_parallel_group():
    raise unsupported(SEQUENCE_PARALLELISM, "deepspeed.utils.groups._get_sequence_parallel_group")


get_data_parallel_group = _get_data_parallel_group
get_data_parallel_world_size = _get_data_parallel_world_size
get_data_parallel_rank = _get_data_parallel_rank
get_model_parallel_world_size = _get_model_parallel_world_size

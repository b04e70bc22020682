"""`deepspeed.runtime.model_checkpointing.constants`: the `checkpoint` section's key names and
DeepSpeed's defaults (the writer's as zerostream.checkpoint.checkpoint_engines fills them in)."""

from zerostream.checkpoint.checkpoint_engines import WRITER_DEFAULTS as _W


class ValidationMode:
    WARN = "WARN"
    IGNORE = "IGNORE"
    FAIL = "FAIL"


class CheckpointWriterType:
    MOCK = "MOCK"
    PYTHON = "PYTHON"
    FAST = "FAST"


class CheckpointDataParallel:
    REPLICA = "REPLICA"
    SOCKET = "SOCKET"
    MACHINE = "MACHINE"


CHECKPOINT = "checkpoint"
CHECKPOINT_TAG_VALIDATION = "tag_validation"
CHECKPOINT_TAG_VALIDATION_DEFAULT = ValidationMode.WARN
CHECKPOINT_TAG_VALIDATION_MODES = [ValidationMode.WARN, ValidationMode.IGNORE, ValidationMode.FAIL]
CHECKPOINT_SERIALIZATION = "checkpoint_serialization"
CHECKPOINT_SERIALIZATION_DEFAULT = True
CHECKPOINT_WRITER = "writer"
CHECKPOINT_WRITER_DEFAULT = None
CHECKPOINT_WRITER_TYPE = "type"
CHECKPOINT_WRITER_TYPE_DEFAULT = _W["type"]
CHECKPOINT_WRITER_TYPES = [
    CheckpointWriterType.MOCK, CheckpointWriterType.PYTHON, CheckpointWriterType.FAST,
]  # fmt: skip
CHECKPOINT_IO_BUFFER_SIZE = "io_buffer_size"
CHECKPOINT_IO_BUFFER_SIZE_DEFAULT = _W["io_buffer_size"]
CHECKPOINT_IO_BUFFER_DOUBLE = "io_buffer_double"
CHECKPOINT_IO_BUFFER_DOUBLE_DEFAULT = _W["io_buffer_double"]
CHECKPOINT_IO_MULTIPLIER = "io_multiplier"
CHECKPOINT_IO_MULTIPLIER_DEFAULT = _W["io_multiplier"]
CHECKPOINT_IO_STATISTICS = "show_statistics"
CHECKPOINT_IO_STATISTICS_DEFAULT = _W["show_statistics"]
CHECKPOINT_DATA_PARALLEL = "data_parallel"
CHECKPOINT_DATA_PARALLEL_DEFAULT = _W["data_parallel"]
CHECKPOINT_DATA_PARALLEL_UNITS = [
    CheckpointDataParallel.REPLICA, CheckpointDataParallel.SOCKET, CheckpointDataParallel.MACHINE,
]  # fmt: skip
CHECKPOINT_WRITER_DECOUPLED = "decoupled"
CHECKPOINT_WRITER_DECOUPLED_DEFAULT = _W["decoupled"]

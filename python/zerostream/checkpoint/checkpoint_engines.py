"""DeepSpeed's checkpoint engines (`deepspeed.runtime.checkpoint_engine`): objects that write
and read the files of one checkpoint tag, for code that drives them itself.

The protocol, as DeepSpeed's engine calls it for each tag:

    info = CheckpointCommitInfo(tag, save_dir, save_latest)
    ce.create(info)                 # the tag begins
    ce.makedirs(dir, exist_ok=True)
    ce.save(state_dict, path)       # any number of files
    ce.commit(info)                 # every file of the tag is written: True when done
    ce.load(path, map_location)     # a file back

`TorchCheckpointEngine` is torch.save / torch.load; `FastCheckpointEngine` serializes through
one of the file writers the `checkpoint.writer` section names (`type` "mock", "python" or
"fast"; file_writer.py, fast_file_writer.py). Both are synchronous: a save has returned once
its file is written (and, through the fast writer, fsynced), so `commit` has nothing to wait
for. What zerostream does not have is refused when built, by name, with what to use instead:
saving in a background process (`DecoupledCheckpointEngine`, `checkpoint.writer.decoupled`),
Azure Nebula (`NebulaCheckpointEngine`, the `nebula` section) and DataStates
(`DataStatesCheckpointEngine`, the `datastates` section), and writers that each write a share
of one file (`checkpoint.writer.data_parallel`, DeepSpeed's parallel writing).

zerostream's own `engine.save_checkpoint` does not go through these objects: it writes every
file with its streamed writer and commits the tag by rename (files.py, Note [Crash-safe
checkpoints]).
"""

from __future__ import annotations

import abc
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any, Optional, cast

import torch

from .. import comm
from ..config import DeepSpeedConfig, load
from ..offload.locked_tensors import locked_tensors
from ..ops.aio import aio_handle
from .fast_file_writer import FastFileWriter, FastFileWriterConfig
from .file_writer import BaseFileWriter, MockFileWriter, PyFileWriter

logger = logging.getLogger("zerostream")

# `checkpoint.writer` with DeepSpeed's defaults (its model_checkpointing constants); `type` and
# `data_parallel` are compared upper-cased, as DeepSpeed stores them.
WRITER_DEFAULTS: Mapping[str, Any] = {
    "type": "FAST",
    "io_buffer_size": 64 * 1024**2,
    "io_buffer_double": True,
    "show_statistics": False,
    "data_parallel": None,
    "decoupled": False,
    "io_multiplier": 1,
}
WRITER_TYPES = ("MOCK", "PYTHON", "FAST")


@dataclass
class CheckpointCommitInfo:
    """One tag being saved: its name, its folder, and whether `latest` is to name it."""

    tag: str
    save_dir: str
    save_latest: bool


@dataclass
class DataParallelWriterConfig:
    """Which writer of how many this rank is (DeepSpeed's model_checkpointing); None in
    its place means the rank writes nothing."""

    world_size: int
    rank: int
    global_rank: int
    local_rank: int
    pure_dp: bool


class CheckpointEngine(abc.ABC):
    """The protocol above; subclasses give create, save, load and commit."""

    def __init__(self, config_params=None):
        self.name: Optional[str] = None

    @abc.abstractmethod
    def create(self, info: CheckpointCommitInfo): ...

    @abc.abstractmethod
    def save(self, state_dict, path: str): ...

    @abc.abstractmethod
    def load(self, path: str, map_location=None): ...

    @abc.abstractmethod
    def commit(self, info: CheckpointCommitInfo): ...

    def makedirs(self, path, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        """Whether data-parallel rank `dp_rank` writes the replicated files."""
        return dp_rank == 0

    def is_decoupled(self) -> bool:
        return False

    def set_commit_info(self, info: CheckpointCommitInfo) -> None:
        """Only a decoupled engine keeps the tag in flight; a synchronous one has none."""
        return None

    def get_commit_info(self) -> Optional[CheckpointCommitInfo]:
        return None

    def cleanup(self) -> None:
        """A decoupled engine's end (its last commit, its process); nothing here."""
        return None

    def preserves_storage_sharing(self) -> bool:
        """Whether tensors sharing a storage are saved once (torch.save does so)."""
        return True


class TorchCheckpointEngine(CheckpointEngine):
    """torch.save and torch.load. Without a config, files are written in torch's legacy
    (non-zip) format, as DeepSpeed's engine of this name does; with one, as
    `checkpoint.checkpoint_serialization` says (default true: the zip format)."""

    def __init__(self, config_params=None):
        super().__init__(config_params)
        self.name = "TorchCheckpointEngine"
        if config_params is None:
            self.zipfile_serialization = False
        else:
            self.zipfile_serialization = _resolved(
                config_params
            ).checkpoint.checkpoint_serialization

    def create(self, info: CheckpointCommitInfo) -> None:
        logger.debug("[Torch] checkpoint %s is about to be saved", info.tag)

    def save(self, state_dict, path: str) -> None:
        torch.save(state_dict, path, _use_new_zipfile_serialization=self.zipfile_serialization)

    def load(self, path: str, map_location=None):
        return torch.load(path, map_location=map_location, weights_only=False)

    def commit(self, info: CheckpointCommitInfo) -> bool:
        return True


class FastCheckpointEngine(CheckpointEngine):
    """torch.save through the writer `checkpoint.writer.type` names (default "fast": pinned
    staging of `io_buffer_size` bytes, halves with `io_buffer_double`, the `aio` section's
    handle). `dp_writer_config` None: this rank writes nothing (save returns at once).
    `optimize_dp_state` (DeepSpeed's engine sets it below ZeRO-3) names several writers each
    writing a share of a file: built for one writer only (the file keeps its name; DeepSpeed
    appends `-<rank>.<writers>` to it, which its load does not read back)."""

    def __init__(
        self,
        config_params,
        dp_writer_config: Optional[DataParallelWriterConfig] = None,
        optimize_dp_state: bool = False,
    ):
        super().__init__(config_params)
        self.name = "FastCheckpointEngine"
        cfg = _resolved(config_params)
        self.serialization_enabled = cfg.checkpoint.checkpoint_serialization
        self.optimize_dp_state = optimize_dp_state
        self._section = writer_section(cfg.checkpoint.writer)
        self._aio = cfg.aio
        self._dp = dp_writer_config
        if dp_writer_config is not None and optimize_dp_state:
            writers = dp_writer_config.world_size * int(self._section["io_multiplier"])
            if writers > 1:
                raise NotImplementedError(
                    f"FastCheckpointEngine: {writers} data-parallel writers (world_size "
                    f"{dp_writer_config.world_size} x checkpoint.writer.io_multiplier "
                    f"{self._section['io_multiplier']}) each writing a share of one file are "
                    "not built in zerostream (torch.save hands every writer the whole file); "
                    "pass a single-writer DataParallelWriterConfig (world_size 1, "
                    "io_multiplier 1) or optimize_dp_state=False"
                )
        if self._section["type"] == "FAST" and self._aio.use_gds:
            raise NotImplementedError(
                "FastCheckpointEngine: aio.use_gds (GPUDirect Storage) is not built in "
                "zerostream; set it to false (the writer stages through host memory)"
            )
        self._handle: Any = None  # the fast writer's aio handle and staging, made at first use
        self._staging: Optional[torch.Tensor] = None

    def create(self, info: CheckpointCommitInfo) -> None:
        pass

    def save(self, state_dict, path: str) -> None:
        if self._dp is None:
            return
        writer = self.create_writer(path)
        try:
            target = cast(IO[bytes], writer)  # a file object torch.save writes into
            torch.save(
                state_dict, target, _use_new_zipfile_serialization=self.serialization_enabled
            )
        finally:
            writer.close()
        if self._section["show_statistics"]:
            writer._dump_state()

    def create_writer(self, path: str) -> BaseFileWriter:
        """A new writer of `checkpoint.writer.type` for `path`."""
        kind = self._section["type"]
        if kind == "MOCK":
            return MockFileWriter(path)
        if kind == "PYTHON":
            return PyFileWriter(path)
        if self._staging is None:
            self._handle, self._staging = self._fast_resources()
        config = FastFileWriterConfig(
            dnvme_handle=self._handle,
            pinned_tensor=self._staging,
            double_buffer=bool(self._section["io_buffer_double"]),
            global_rank=0 if self._dp is None else self._dp.global_rank,
        )
        return FastFileWriter(path, config)

    def _fast_resources(self) -> tuple[Any, torch.Tensor]:
        """The fast writer's aio handle (the `aio` section's) and page-locked staging of
        `io_buffer_size` bytes, made at the first save and kept for the next ones."""
        a = self._aio
        handle = aio_handle(
            block_size=a.block_size,
            queue_depth=a.queue_depth,
            single_submit=a.single_submit,
            overlap_events=a.overlap_events,
            intra_op_parallelism=a.intra_op_parallelism,
            backend=a.backend,
        )
        size = int(self._section["io_buffer_size"])
        return handle, locked_tensors().new(size, torch.uint8, "checkpoint.writer staging")

    def load(self, path: str, map_location=None):
        return torch.load(path, map_location=map_location, weights_only=False)

    def commit(self, info: CheckpointCommitInfo) -> bool:
        return True

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        return self._dp is not None


class _NotBuilt(CheckpointEngine):
    """An engine zerostream does not have: building one raises `REFUSAL` (the methods are
    there so that the class is concrete and the refusal, not ABC's TypeError, is what a
    caller sees)."""

    REFUSAL = ""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(self.REFUSAL)

    def create(self, info: CheckpointCommitInfo):
        raise NotImplementedError(self.REFUSAL)

    def save(self, state_dict, path: str):
        raise NotImplementedError(self.REFUSAL)

    def load(self, path: str, map_location=None):
        raise NotImplementedError(self.REFUSAL)

    def commit(self, info: CheckpointCommitInfo):
        raise NotImplementedError(self.REFUSAL)


class DecoupledCheckpointEngine(_NotBuilt):
    """Refused: DeepSpeed's saves in a background process that `commit` waits for. Takes
    (config_params, dp_writer_config, optimize_dp_state)."""

    REFUSAL = (
        "DecoupledCheckpointEngine (checkpoint.writer.decoupled: true): saving in a "
        "background process is not built in zerostream; use FastCheckpointEngine or "
        "TorchCheckpointEngine (a save returns with its file written), or "
        "engine.save_checkpoint"
    )


class NebulaCheckpointEngine(_NotBuilt):
    """Refused: Azure Nebula's tiered checkpoint service (torch_nebula). Takes
    (config_params)."""

    REFUSAL = (
        "NebulaCheckpointEngine (the nebula section): Azure Nebula checkpointing "
        "(torch_nebula) is not built in zerostream; use TorchCheckpointEngine, "
        "FastCheckpointEngine or engine.save_checkpoint"
    )


class DataStatesCheckpointEngine(_NotBuilt):
    """Refused: DataStates-LLM's asynchronous checkpoint engine (the datastates package).
    Takes (deepspeed_config, rank)."""

    REFUSAL = (
        "DataStatesCheckpointEngine (the datastates section): DataStates-LLM's "
        "asynchronous checkpointing is not built in zerostream; use "
        "TorchCheckpointEngine, FastCheckpointEngine or engine.save_checkpoint"
    )


def create_checkpoint_engine(
    config_params, groups=None, zero_stage: int = 0, has_moe_layers: bool = False,
    optimize_dp_state: bool = False,
) -> CheckpointEngine:  # fmt: skip
    """The engine a config asks for, by DeepSpeed's rule: `checkpoint.writer` set: the fast
    engine (decoupled: refused); else `nebula` or `datastates` enabled: refused (DeepSpeed
    falls back to torch.save when their packages are missing; here the section is named);
    else torch.save. The fast engine's writer: data-parallel rank 0, or every rank when ZeRO
    partitions the optimizer state (stage >= 1), each writing its own files."""
    if config_params is None:
        return TorchCheckpointEngine(None)
    cfg = _resolved(config_params)
    if cfg.checkpoint.writer is not None:
        section = writer_section(cfg.checkpoint.writer)
        if has_moe_layers:
            raise NotImplementedError(
                "create_checkpoint_engine: checkpoint.writer with MoE layers (expert "
                "parallelism) is not built in zerostream"
            )
        if section["data_parallel"] is not None:
            raise NotImplementedError(
                f"checkpoint.writer.data_parallel={section['data_parallel']!r}: writers that "
                "each write a share of one file are not built in zerostream; leave it unset "
                "(each rank writes its own files)"
            )
        if section["decoupled"]:
            return DecoupledCheckpointEngine(cfg, None, optimize_dp_state)
        dp_rank, global_rank = _dp_rank(groups)
        writes = dp_rank == 0 or zero_stage >= 1
        local = int(os.environ.get("LOCAL_RANK", "0"))
        dp = DataParallelWriterConfig(1, 0, global_rank, local, True) if writes else None
        return FastCheckpointEngine(cfg, dp, optimize_dp_state)
    if _enabled(cfg.nebula):
        return NebulaCheckpointEngine(cfg)
    if _enabled(cfg.datastates):
        return DataStatesCheckpointEngine(cfg, _dp_rank(groups)[1])
    return TorchCheckpointEngine(cfg)


def writer_section(given) -> dict:
    """`checkpoint.writer` with DeepSpeed's defaults filled in (None: all defaults); values
    are checked when the config loads (csrc/config/rules.cpp), a mapping given here too."""
    section = dict(WRITER_DEFAULTS)
    for key, value in (given or {}).items():
        if key not in WRITER_DEFAULTS:
            raise ValueError(
                f"checkpoint.writer.{key}: unknown key (DeepSpeed's writer keys: "
                f"{', '.join(WRITER_DEFAULTS)})"
            )
        section[key] = value
    for key in ("type", "data_parallel"):
        if isinstance(section[key], str):
            section[key] = section[key].upper()
    if section["type"] not in WRITER_TYPES:
        raise ValueError(
            f"checkpoint.writer.type: expected one of mock, python, fast; got {section['type']!r}"
        )
    size = section["io_buffer_size"]
    if isinstance(size, bool) or not isinstance(size, (int, float)) or size < 2:
        raise ValueError(f"checkpoint.writer.io_buffer_size: expected >= 2 bytes; got {size!r}")
    return section


def _resolved(config_params):
    """zerostream's resolved config from what DeepSpeed's engines take: the resolved config
    itself (what `deepspeed.runtime.config.DeepSpeedConfig` returns) or a ds_config dict."""
    if isinstance(config_params, DeepSpeedConfig):
        return config_params
    if isinstance(config_params, Mapping):
        return load(dict(config_params), require_batch=False, log=False)
    raise ValueError(
        "checkpoint engine config_params: expected a DeepSpeedConfig "
        "(deepspeed.runtime.config.DeepSpeedConfig(ds_config)) or a ds_config dict; got "
        f"{type(config_params).__name__}"
    )


def _enabled(section) -> bool:
    return isinstance(section, Mapping) and section.get("enabled") is True


def _dp_rank(groups) -> tuple[int, int]:
    """(data-parallel rank, global rank): the model-parallel unit's, if `groups` has one."""
    mpu = getattr(groups, "mpu", None)
    dp_rank = mpu.get_data_parallel_rank() if mpu is not None else comm.get_rank()
    return int(dp_rank), comm.get_rank()


__all__ = [
    "CheckpointCommitInfo",
    "CheckpointEngine",
    "DataParallelWriterConfig",
    "TorchCheckpointEngine",
    "FastCheckpointEngine",
    "DecoupledCheckpointEngine",
    "NebulaCheckpointEngine",
    "DataStatesCheckpointEngine",
    "create_checkpoint_engine",
    "writer_section",
]

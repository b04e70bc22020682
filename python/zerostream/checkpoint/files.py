"""Checkpoint files that survive a crash at any point, and that say which file is bad.

Note [Crash-safe checkpoints]
  A checkpoint is never written in place. All ranks write their files into a staging
  directory `<save_dir>/.<tag>.partial` (each file fsynced before the writer returns);
  after a barrier, and only if every rank succeeded, rank 0 fsyncs the staging directory
  and makes it `<save_dir>/<tag>` in one rename: a plain rename when the tag is new, an
  atomic exchange (renameat2 RENAME_EXCHANGE) when it replaces an older checkpoint of the
  same tag, whose files are then deleted. Only after that is `latest` replaced, by writing
  `latest.partial`, fsyncing it and renaming it over `latest`; the parent directory is
  fsynced after each rename. A process killed anywhere in between leaves the previous
  checkpoint and `latest` exactly as they were, plus a `.partial` leftover that the next
  save removes.

  Every tag directory also gets `zerostream_manifest.json`: the size and CRC-32 of each file
  as written, gathered from all ranks. The loader checks a file against it before
  unpickling, so a truncated or corrupted file is reported by name (with what differs)
  instead of surfacing as an unpickling error deep in torch. A checkpoint without a manifest
  (one written by DeepSpeed) is loaded unchecked.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
import zlib
from typing import TYPE_CHECKING, Any, Dict, Iterable, Optional

import torch

if TYPE_CHECKING:
    from ..config import AioConfig
    from ..offload import io_engine as zio
    from .target import CheckpointTarget
from . import compat_unpickle, layout, stream

MANIFEST = "zerostream_manifest.json"
LATEST = "latest"
_CHUNK = 8 << 20


def kill_point(name: str) -> None:
    """Test-only fault injection (shared/TESTING.md, "Processes that die"): the process
    SIGKILLs itself at the named point of a save when ZEROSTREAM_TEST_KILL_AT names it
    (optionally `name@rank`)."""
    want = os.environ.get("ZEROSTREAM_TEST_KILL_AT")
    if not want:
        return
    point, _, rank = want.partition("@")
    if point == name and (not rank or rank == os.environ.get("RANK", "0")):
        os.kill(os.getpid(), signal.SIGKILL)


class _HashingWriter:
    """A binary file that keeps the CRC-32 and size of what goes through it."""

    def __init__(self, f):
        self.f, self.crc, self.size = f, 0, 0
        self.error: Optional[OSError] = None  # torch's zip writer rewraps it as RuntimeError

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.size += view.nbytes
        try:
            return self.f.write(view)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.f.flush()


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _with_path(exc: OSError, action: str, path: str) -> OSError:
    return OSError(exc.errno, f"checkpoint: cannot {action} {path}: {exc.strerror or exc}")


def io_engine(aio: Optional["AioConfig"] = None, given: Iterable[str] = ()) -> "zio.IoEngine":
    """The I/O engine checkpoint files stream through: the engine's own defaults, with the
    settings the run's ds_config `aio` section sets (`given`: its keys) applied, through the
    mapping the swap store uses (offload/io_engine.io_config_for). One per distinct setting per
    process, made on first use."""
    from ..offload import io_engine as zio

    config = zio.io_config() if aio is None else zio.io_config_for(aio, given=list(given))
    key = (
        config.block_size,
        config.queue_depth,
        config.threads,
        config.single_submit,
        config.overlap_events,
        str(config.backend),
    )
    engine = _ENGINES.get(key)
    if engine is None:
        engine = _ENGINES[key] = zio.IoEngine(config)
    return engine


def io_engine_for(target: "CheckpointTarget") -> "zio.IoEngine":
    """io_engine() for a training run's checkpoints."""
    return io_engine(target.aio, given=target.aio_keys)


_ENGINES: Dict[tuple, "zio.IoEngine"] = {}


def save_file(obj: Any, path: str, engine: Optional["zio.IoEngine"] = None) -> Dict[str, Any]:
    """torch.save(obj) to `path` durably: written to `path.partial` (streamed through the I/O
    engine where this torch can: stream.py, Note [Streamed checkpoint files]), fsynced,
    renamed; `engine`: the I/O engine to stream through (io_engine(), the defaults, if None).
    Returns the file's manifest entry. On any error the partial file is removed and
    the OSError names the path."""
    tmp = path + ".partial"
    writer = None
    try:
        with open(tmp, "wb") as f:
            if stream.AVAILABLE:
                entry = stream.write_file(obj, f, tmp, engine or io_engine())
            else:
                writer = _HashingWriter(f)
                torch.save(obj, writer)
                entry = {"bytes": writer.size, "crc32": writer.crc}
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        _remove_quietly(tmp)
        cause = exc if isinstance(exc, OSError) else getattr(writer, "error", None)
        if cause is not None:
            raise _with_path(cause, "write", path) from exc
        raise
    return entry


def save_text(text: str, path: str) -> None:
    """Replaces the text file `path` atomically (tmp, fsync, rename, fsync the directory)."""
    tmp = path + ".partial"
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(os.path.abspath(path)))
    except OSError as exc:
        _remove_quietly(tmp)
        raise _with_path(exc, "write", path) from exc


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# --- the staging directory ---------------------------------------------------------------------
def staging_dir(save_dir: str, tag: str) -> str:
    return os.path.join(save_dir, f".{tag}.partial")


def _renameat2_exchange(a: str, b: str) -> bool:
    """Atomically swaps two paths; False where the kernel or filesystem cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), ctypes.c_uint(rename_exchange))
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, f"checkpoint: cannot exchange {a} and {b}: {os.strerror(err)}")


def commit_dir(staging: str, final: str) -> None:
    """Makes the fully written staging directory the tag directory `final` (Note
    [Crash-safe checkpoints]); the checkpoint it replaces, if any, is deleted after."""
    parent = os.path.dirname(os.path.abspath(final))
    fsync_dir(staging)
    try:
        if not os.path.exists(final):
            os.rename(staging, final)
        elif _renameat2_exchange(staging, final):
            shutil.rmtree(staging)  # now holds the replaced checkpoint
        else:
            # No atomic exchange here: the old tag leaves first. A crash between the two
            # renames leaves `<tag>` missing and the new files complete in the staging
            # directory; resolve_tag_dir() finds them there.
            old = final + ".replaced"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
            os.rename(staging, final)
            shutil.rmtree(old)
    except OSError as exc:
        raise _with_path(exc, "commit the checkpoint directory", final) from exc
    fsync_dir(parent)


def resolve_tag_dir(load_dir: str, tag: str) -> str:
    """The directory of `tag`, or its complete staging directory when a save without atomic
    exchange was interrupted between its two renames."""
    final = os.path.join(load_dir, tag)
    if os.path.isdir(final):
        return final
    staged = staging_dir(load_dir, tag)
    if os.path.isfile(os.path.join(staged, MANIFEST)):
        return staged
    return final


# --- manifest and loading ----------------------------------------------------------------------
def write_manifest(directory: str, entries: Dict[str, Dict[str, int]]) -> None:
    save_text(
        json.dumps({"files": entries}, indent=1, sort_keys=True), os.path.join(directory, MANIFEST)
    )


def read_manifest(directory: str) -> Optional[Dict[str, Dict[str, int]]]:
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"checkpoint manifest {path} is unreadable: {exc}") from exc


def verify_file(path: str, manifest: Optional[Dict[str, Dict[str, int]]]) -> None:
    """Raises ValueError naming `path` when its size or checksums differ from the manifest:
    a streamed file's headers and pickle here, its tensors as they are read (stream.py);
    an older file's CRC-32 over all of it."""
    if manifest is None:
        return
    entry = manifest.get(os.path.basename(path))
    if entry is None:
        return
    if "ranges" in entry:
        stream.verify_headers(path, entry)
        return
    size = os.path.getsize(path)
    if size != entry["bytes"]:
        raise ValueError(
            f"checkpoint file {path} is truncated or overwritten: {size} bytes, the manifest "
            f"written with it says {entry['bytes']}"
        )
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    if crc != entry["crc32"]:
        raise ValueError(
            f"checkpoint file {path} is corrupted: CRC-32 {crc:#010x}, the manifest written "
            f"with it says {entry['crc32']:#010x}"
        )


def load_file(
    path: str, manifest=None, lazy: bool = False, engine: Optional["zio.IoEngine"] = None
) -> Any:
    """torch.load of one checkpoint file onto the CPU (weights only, DeepSpeed's pickled
    classes read as plain data: compat_unpickle.py), its tensors read through the I/O
    engine (stream.py), checked against the manifest; every failure names the file.
    `lazy`: large tensors stay in the file as stream.FileTensor (read by their consumer)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(errno.ENOENT, "checkpoint file is missing", path)
    verify_file(path, manifest)
    entry = (manifest or {}).get(os.path.basename(path))
    try:
        if stream.AVAILABLE and _is_zip(path):
            return stream.read_file(path, entry, engine or io_engine(), lazy=lazy)
        return compat_unpickle.load(path)
    except (compat_unpickle.ForbiddenGlobalError, stream.ChecksumError):
        raise
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, ...
        raise ValueError(
            f"checkpoint file {path} cannot be read ({type(exc).__name__}: {exc}); it is "
            f"truncated, corrupted or not a torch checkpoint"
        ) from exc


def _is_zip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


class Checkpoint:
    """One tag directory: its files, its manifest, and loading that names what failed."""

    def __init__(self, directory: str, io: Optional["zio.IoEngine"] = None):
        self.dir = directory
        self.manifest = read_manifest(directory)
        self.io = io  # the I/O engine its files stream through (io_engine() if None)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def load(self, name: str, lazy: bool = False) -> Any:
        return load_file(self.path(name), self.manifest, lazy=lazy, engine=self.io)

    def optim_file(self, dp_rank: int, bf16: bool) -> str:
        for name in layout.optim_states_candidates(dp_rank, bf16):
            if os.path.isfile(self.path(name)):
                return name
        raise FileNotFoundError(
            f"checkpoint {self.dir} has no optimizer state for data-parallel rank {dp_rank} "
            f"(looked for {layout.optim_states_name(dp_rank, bf16)}); the save did not "
            f"complete on that rank, or the files were moved"
        )

"""Checkpoint files whose tensor bytes move through the offload I/O engine.

Note [Streamed checkpoint files]
  A checkpoint file is torch's zip format, so torch.load alone reads it (DeepSpeed's tools,
  a user's script). torch.save cannot write one fast: it hands each tensor's bytes to a
  Python file object, which goes through the page cache, and it computes the zip CRC-32 on
  the calling thread. Here a file is written in two passes:

  1. torch.save of the object with every tensor replaced by a placeholder of its shape and
     dtype (untouched memory, never read), under torch.serialization.skip_data, with
     `storage_alignment` 4096 and the zip CRC off (torch.utils.serialization.config). torch
     writes the pickle, the zip headers and the central directory, and leaves each
     tensor's bytes as a gap starting on a 4 KiB boundary. The writer below records the
     CRC32C of every range torch writes.
  2. torch.load(map_location="meta") of that file gives each storage's offset, and the I/O
     engine writes the tensors' bytes there: O_DIRECT for whole blocks, the buffered
     descriptor for a record's unaligned tail (offload/README.md, "Guarantees"), from the
     live tensors themselves (no copy), or chunk by chunk from a source that streams them
     (a swap store's sub-groups, a device tensor through a staging buffer). Each
     payload's CRC32C is taken while its writes are in flight.

  Then fsync and rename (files.py, Note [Crash-safe checkpoints]). The manifest entry of the
  file lists its ranges, [start, end, crc32c, is_payload], covering every byte. Reading
  reverses it: the non-payload ranges (headers and pickle, small) are checked first, so a
  damaged file is named before anything is unpickled; torch.load(map_location="meta")
  gives the structure and offsets; each storage is read by the engine into memory (or
  streamed straight into its destination by a caller) and checked against its range.

  The zip's own CRC fields are zero, as torch writes them with compute_crc32 off; torch.load
  does not check them. The manifest is what guards the bytes. Files without ranges in the
  manifest (older zerostream checkpoints, DeepSpeed's) are read through the same engine
  path, checked by whatever their manifest holds.
"""

from __future__ import annotations

import bisect
import os
from collections import deque
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

try:
    from torch.utils.serialization import config as _ser_config
except ImportError:  # older torch
    _ser_config = None

from ..lazy_tensor import LazyTensor
from ..offload.crc32c import crc32c, crc32c_at
from ..offload.host_buffers import aligned_empty, populate
from ..offload.io_engine import IoEngine
from . import compat_unpickle
from .tree import map_leaves

# torch 2.5+ has skip_data; storage_alignment came later. Older torch: files.py's plain path.
AVAILABLE = hasattr(torch.serialization, "skip_data") and hasattr(
    getattr(_ser_config, "save", None), "storage_alignment"
)
ALIGN = 4096
CHUNK_BYTES = 64 << 20  # staging chunk for sources that are not contiguous CPU tensors
DEPTH = 2  # chunks of a streamed source in flight


# --- payload sources ---------------------------------------------------------------------------
def is_source(obj: Any) -> bool:
    """A streamed source: an object with `shape`, `dtype` and `chunks()`, which yields the
    bytes in order as contiguous CPU tensors without the whole tensor in memory (e.g. an
    NVMe-offloaded optimizer state, offload/optimizer_swap.py SwapStateSource). A yielded
    chunk may be overwritten once DEPTH more have been asked for: the writer waits for its
    write before that."""
    return not torch.is_tensor(obj) and hasattr(obj, "chunks") and hasattr(obj, "shape")


def _tensor_chunks(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """A non-contiguous or device tensor through DEPTH rotating staging buffers."""
    flat = t.reshape(-1) if t.is_contiguous() else t.contiguous().reshape(-1)
    per = max(1, CHUNK_BYTES // max(1, flat.element_size()))
    pin = flat.device.type == "cuda"
    bufs = [
        torch.empty(min(per, flat.numel()), dtype=flat.dtype, pin_memory=pin) for _ in range(DEPTH)
    ]
    for i, lo in enumerate(range(0, flat.numel(), per)):
        n = min(per, flat.numel() - lo)
        buf = bufs[i % DEPTH][:n]
        buf.copy_(flat[lo : lo + n])
        yield buf


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8)


def _direct(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.is_contiguous()


def _placeholder(shape, dtype: torch.dtype) -> torch.Tensor:
    """A tensor torch.save describes but, under skip_data, never reads: its pages stay
    untouched (no memory) unless deterministic mode fills fresh tensors."""
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        return torch.empty(shape, dtype=dtype)
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill


def _swap_in_placeholders(obj: Any, sources: Dict[int, Tuple[torch.Tensor, Any]], memo: dict):
    """`obj` with each tensor and source (is_source) replaced by a placeholder; `sources` maps the
    placeholder storage's id to (placeholder, what fills it). Tensors with the same storage
    and geometry (tied weights) share one placeholder, as torch.save shares their storage."""

    def placeholder(leaf: Any) -> torch.Tensor:
        if torch.is_tensor(leaf):
            t = leaf.detach()
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride())
            key = (*key, t.dtype, str(t.device)) if t.untyped_storage().data_ptr() else id(leaf)
        else:
            t, key = leaf, id(leaf)
        if key not in memo:
            ph = _placeholder(t.shape, t.dtype)
            memo[key] = ph
            sources[id(ph.untyped_storage())] = (ph, t)
        return memo[key]

    return map_leaves(obj, placeholder, lambda x: is_source(x) or torch.is_tensor(x))


def _pair_offsets(saved: Any, loaded: Any, out: Dict[int, int]) -> None:
    """Walks the placeholder object and its meta-loaded twin together: placeholder storage
    id -> the file offset of its bytes."""
    if torch.is_tensor(saved):
        out[id(saved.untyped_storage())] = loaded.untyped_storage()._checkpoint_offset
    elif isinstance(saved, dict):
        for k, v in saved.items():
            _pair_offsets(v, loaded[k], out)
    elif isinstance(saved, (list, tuple)) and not isinstance(saved, torch.Size):
        for a, b in zip(saved, loaded):
            _pair_offsets(a, b, out)


def _crc_of_bytes(data, crc: int = 0) -> int:
    """CRC32C of a bytes-like object (read-only ones too, as torch's writer passes)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    return crc32c_at(arr.ctypes.data, arr.nbytes, crc) if arr.nbytes else crc


# --- writing -----------------------------------------------------------------------------------
class _RangeWriter:
    """The file object torch.save writes through: the bytes go to `f`, and every contiguous
    run of them gets its CRC32C; seeks (the gaps skip_data leaves) end a run."""

    def __init__(self, f):
        self.f, self.pos = f, 0
        self.ranges: List[List[int]] = []  # [start, end, crc32c]
        self.error: Optional[OSError] = None  # torch's zip writer rewraps it as RuntimeError

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if not self.ranges or self.ranges[-1][1] != self.pos:
            self.ranges.append([self.pos, self.pos, 0])
        run = self.ranges[-1]
        run[2] = _crc_of_bytes(view, run[2])
        try:
            self.f.write(view)
        except OSError as exc:
            self.error = exc
            raise
        self.pos += view.nbytes
        run[1] = self.pos
        return view.nbytes

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.pos = offset if whence == os.SEEK_SET else self.pos + offset
        self.f.seek(self.pos)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        self.f.flush()


def write_file(obj: Any, f, path: str, engine: "IoEngine") -> Dict[str, Any]:
    """Writes `obj` into the open, empty file `f` (at `path`) as Note [Streamed checkpoint
    files] describes; returns its manifest entry {"bytes", "ranges"}. The caller fsyncs."""
    sources: Dict[int, Tuple[torch.Tensor, Any]] = {}
    shell = _swap_in_placeholders(obj, sources, {})
    writer = _RangeWriter(f)
    with (
        torch.serialization.skip_data(),
        _ser_config.patch({"save.storage_alignment": ALIGN, "save.compute_crc32": False}),
    ):
        try:
            torch.save(shell, writer)
        except RuntimeError as exc:
            if writer.error is not None:
                raise writer.error from exc
            raise
    f.flush()
    offsets: Dict[int, int] = {}
    _pair_offsets(shell, torch.load(path, map_location="meta", weights_only=True), offsets)
    ranges = [r + [0] for r in writer.ranges]
    inflight: List[Any] = []  # tickets of live tensors' writes (a dropped ticket waits)
    for sid, (ph, src) in sources.items():
        nbytes = ph.numel() * ph.element_size()
        if nbytes:
            start = offsets[sid]
            crc = _write_payload(engine, path, start, src, inflight)
            ranges.append([start, start + nbytes, crc, 1])
    engine.wait_all()
    inflight.clear()
    ranges.sort()
    return {"bytes": writer.pos, "ranges": ranges}


def _write_payload(
    engine: "IoEngine", path: str, offset: int, src: Any, inflight: List[Any]
) -> int:
    """Queues the writes of one payload at `offset`; returns its CRC32C. A live tensor's
    write is left in flight, its ticket in `inflight` (the caller's wait_all ends it), so
    the CRC and the next payloads' writes overlap it; a dropped ticket would wait for its
    write right there (Note [Buffer lifetime] in offload_bindings.cpp)."""
    if torch.is_tensor(src) and _direct(src):
        data = _byte_view(src.detach())
        inflight.append(engine.write(data, path, offset))  # the live tensor itself
        return crc32c(data)
    chunks = src.chunks() if is_source(src) else _tensor_chunks(src.detach())
    crc, pos, pending = 0, offset, deque()
    for chunk in chunks:
        data = _byte_view(chunk)
        pending.append(engine.write(data, path, pos))
        crc = crc32c(data, crc)
        pos += data.numel()
        if len(pending) >= DEPTH:  # the producer reuses this chunk's buffer next
            pending.popleft().wait()
    for ticket in pending:
        ticket.wait()
    return crc


# --- reading -----------------------------------------------------------------------------------
class ChecksumError(ValueError):
    pass


def _range_of(entry: Optional[dict], start: int, end: int) -> Optional[List[int]]:
    ranges = (entry or {}).get("ranges")
    if not ranges:
        return None
    i = bisect.bisect_left(ranges, [start])
    if i < len(ranges) and ranges[i][0] == start and ranges[i][1] == end:
        return ranges[i]
    return None


def verify_headers(path: str, entry: dict) -> None:
    """Checks the size and the non-payload ranges (zip headers, pickle) of a streamed file."""
    size = os.path.getsize(path)
    if size != entry["bytes"]:
        raise ChecksumError(
            f"checkpoint file {path} is truncated or overwritten: {size} bytes, the manifest "
            f"written with it says {entry['bytes']}"
        )
    with open(path, "rb") as f:
        for start, end, crc, payload in entry["ranges"]:
            if payload:
                continue
            f.seek(start)
            data = f.read(end - start)
            got = _crc_of_bytes(data)
            if got != crc:
                raise ChecksumError(_damaged(path, start, end, got, crc))


def _damaged(path: str, start: int, end: int, got: int, want: int) -> str:
    return (
        f"checkpoint file {path} is corrupted: bytes [{start}, {end}) have CRC32C {got:#010x}, "
        f"the manifest written with it says {want:#010x}"
    )


LAZY_BYTES = 1 << 20  # read_file(lazy=True) leaves contiguous tensors this big in the file


class FileTensor(LazyTensor):
    """A contiguous tensor whose bytes are still in a checkpoint file (read_file(lazy=True)):
    a consumer reads it piece by piece into its own memory (read_into), so a large state
    never sits whole in host memory beside its destination. Reads that cover it in order
    are checked against its manifest range; `materialize()` gives an ordinary tensor."""

    def __init__(self, path, offset, dtype, shape, engine, want: Optional[List[int]]):
        self.path, self.offset, self.dtype, self.shape = path, offset, dtype, torch.Size(shape)
        self.engine, self.want = engine, want  # want: [start, end, crc32c, 1] of its storage
        self._elem = torch.empty((), dtype=dtype).element_size()
        self._next = 0 if want is not None and want[0] == offset else -1
        self._crc = 0

    def element_size(self) -> int:
        return self._elem

    def read_into(self, dst: torch.Tensor, lo: int = 0) -> torch.Tensor:
        """Elements [lo, lo + dst.numel()) of the flattened tensor into `dst` (cast to its
        dtype)."""
        n = dst.numel()
        if lo < 0 or lo + n > self.numel():
            raise IndexError(f"{self.path}: elements [{lo}, {lo + n}) of {self.numel()}")
        direct = dst.dtype == self.dtype and _direct(dst)
        buf = dst if direct else aligned_empty(n, self.dtype)
        data, elem = _byte_view(buf), self.element_size()
        # Every chunk queued at once, each populated just before (fresh memory would be
        # faulted in on the I/O path instead); each is checked while later ones are read.
        start = self.offset + lo * elem
        steps = range(0, data.numel(), CHUNK_BYTES)
        tickets = [
            self.engine.read(populate(data[o : o + CHUNK_BYTES]), self.path, start + o)
            for o in steps
        ]
        for o, ticket in zip(steps, tickets):
            ticket.wait()
            self._check(lo + o // elem, data[o : o + CHUNK_BYTES])
        if not direct:
            dst.copy_(buf.view_as(dst) if dst.is_contiguous() else buf.view(dst.shape))
        return dst

    def _check(self, lo: int, data: torch.Tensor) -> None:
        if self._next != lo:  # out of order: this pass is not checked
            self._next = -1
            return
        self._crc = crc32c(data, self._crc)
        self._next += data.numel() // self.element_size()
        if self._next == self.numel():
            self._next = -1
            if self._crc != self.want[2]:
                start, end = self.want[0], self.want[1]
                raise ChecksumError(_damaged(self.path, start, end, self._crc, self.want[2]))


def read_file(path: str, entry: Optional[dict], engine: "IoEngine", lazy: bool = False) -> Any:
    """The object in `path`, every tensor read by the engine into CPU memory and checked
    against `entry`'s ranges when it has them. `lazy`: contiguous tensors of at least
    LAZY_BYTES that own their storage stay in the file as FileTensors."""
    structure = compat_unpickle.load(path, map_location="meta")
    storages: Dict[int, torch.UntypedStorage] = {}
    pending: List[Tuple[torch.Tensor, int, Optional[List[int]]]] = []

    def real(t: torch.Tensor) -> Any:
        meta = t.untyped_storage()
        sid = id(meta)
        nbytes = meta.nbytes()
        if (
            lazy
            and nbytes >= LAZY_BYTES
            and t.is_contiguous()
            and t.storage_offset() == 0
            and t.numel() * t.element_size() == nbytes
            and sid not in storages
        ):
            start = meta._checkpoint_offset
            want = _range_of(entry, start, start + nbytes)
            return FileTensor(path, start, t.dtype, t.shape, engine, want)
        if sid not in storages:
            buf = populate(aligned_empty(nbytes))
            if nbytes:  # the ticket is kept: dropping it would wait for the read here
                start = meta._checkpoint_offset
                ticket = engine.read(buf, path, start)
                pending.append((buf, start, _range_of(entry, start, start + nbytes), ticket))
            storages[sid] = buf
        buf = storages[sid]
        out = torch.empty(0, dtype=t.dtype)
        at = buf.storage_offset() // t.element_size() + t.storage_offset()
        return out.set_(buf.untyped_storage(), at, t.shape, t.stride())

    obj = map_leaves(structure, real)
    engine.wait_all()
    for buf, start, want, _ in pending:
        if want is not None:
            got = crc32c(buf)
            if got != want[2]:
                raise ChecksumError(_damaged(path, start, want[1], got, want[2]))
    return obj

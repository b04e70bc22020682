"""zerostream's own offload I/O API: the native engine, arena and swap store over torch tensors.

The native core (``zerostream._C.offload``) works on (pointer, bytes); this module turns
torch tensors into those and keeps each tensor alive in the request's ticket until the
I/O is over (see Note [Buffer lifetime] in ``csrc/bindings/offload_bindings.cpp``).
``zerostream.ops.aio`` builds DeepSpeed's ``aio_handle`` on top of it.

    engine = IoEngine(block_size=1 << 20, queue_depth=32)
    arena = HostArena(budget_bytes=1 << 30)
    buf = arena.empty(1 << 20, torch.float32)          # page-locked, 4 KiB aligned
    engine.write(buf, "/nvme/x.bin").wait()
    store = SwapStore(engine, "/nvme", rank=0, name="optimizer")
    ticket = store.write(7, buf)                        # wait() for this request only
"""

from __future__ import annotations

import atexit
import errno
import weakref
from typing import TYPE_CHECKING, Iterable, Optional

import torch

from zerostream import _C

if TYPE_CHECKING:
    from zerostream.config import AioConfig

_N = _C.offload

IoError = _N.IoError  # an OSError: .errno is set when the OS gave one
IoTicket = _N.IoTicket

BACKENDS = ("auto", "io_uring", "threads")


def io_config(**overrides) -> "_N.IoConfig":
    """An IoConfig: the native engine's own defaults (offload/io_config.h) with `overrides`
    applied by IoConfig field name (block_size, queue_depth, threads, single_submit,
    overlap_events, backend, use_direct, register_buffers, register_files). For the engine's
    direct users (DeepSpeed's aio_handle, benchmarks, tests); a ds_config goes through
    io_config_for()."""
    c = _N.IoConfig()
    for name, value in overrides.items():
        if not hasattr(c, name):
            raise TypeError(f"io_config: unknown IoConfig field {name!r}")
        setattr(c, name, value)  # backend: raises ValueError naming aio.backend and the choices
    c.validate()
    return c


# ds_config aio key -> (IoConfig field, AioConfig attribute holding its resolved value)
_AIO_FIELDS = {
    "block_size": ("block_size", "block_size"),
    "queue_depth": ("queue_depth", "queue_depth"),
    "intra_op_parallelism": ("threads", "intra_op_parallelism"),
    "thread_count": ("threads", "intra_op_parallelism"),  # DeepSpeed's old name
    "single_submit": ("single_submit", "single_submit"),
    "overlap_events": ("overlap_events", "overlap_events"),
    "backend": ("backend", "backend"),
}


def io_config_for(aio: "AioConfig", given: Optional[Iterable[str]] = None) -> "_N.IoConfig":
    """The one mapping from the resolved ds_config `aio` section to the engine's config.
    `given`: only these aio keys (the ones the ds_config set) apply and the rest keep the
    engine's own defaults, and use_gds does not apply (the checkpoint path, whose bytes are
    in host memory: DeepSpeed's queue_depth default of 8 reads a checkpoint at 0.72 GB/s on
    the dev VM's disk, the engine's 32 at 0.96-1.10; benchmarks/checkpoint.md)."""
    if given is None and aio.use_gds:
        raise NotImplementedError(
            "aio.use_gds: GPUDirect Storage is not supported by "
            "zerostream; remove the key or set it to false"
        )
    keys = _AIO_FIELDS if given is None else [k for k in given if k in _AIO_FIELDS]
    return io_config(**{_AIO_FIELDS[k][0]: getattr(aio, _AIO_FIELDS[k][1]) for k in keys})


def tensor_span(tensor: torch.Tensor, what: str = "tensor") -> tuple[int, int]:
    """(data pointer, bytes) of a contiguous CPU tensor; ValueError otherwise."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{what}: expected a torch.Tensor; got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{what}: expected a CPU tensor; got device {tensor.device}")
    if not tensor.is_contiguous():
        raise ValueError(
            f"{what}: expected a contiguous tensor (shape {tuple(tensor.shape)}, "
            f"stride {tensor.stride()})"
        )
    return tensor.data_ptr(), tensor.numel() * tensor.element_size()


class IoEngine:
    """Asynchronous reads and writes of tensors to files; one ticket per request."""

    def __init__(self, config: Optional["_N.IoConfig"] = None, **overrides):
        """`config`, or the engine's defaults with IoConfig field `overrides` (io_config)."""
        self._engine = _N.IoEngine(config if config is not None else io_config(**overrides))
        self._registered: dict[int, torch.Tensor] = {}

    @property
    def backend(self) -> str:
        return self._engine.backend

    @property
    def config(self) -> "_N.IoConfig":
        return self._engine.config

    @property
    def native(self) -> "_N.IoEngine":
        return self._engine

    @property
    def bounce_buffers(self) -> int:
        """Bounce buffers made so far (Note [Bounce buffers]): 0 while every buffer was
        aligned like its file offset."""
        return self._engine.bounce_buffers

    def read(self, tensor: torch.Tensor, path: str, offset: int = 0) -> IoTicket:
        ptr, nbytes = tensor_span(tensor, "read buffer")
        return self._engine.read(str(path), ptr, nbytes, int(offset), tensor)

    def write(self, tensor: torch.Tensor, path: str, offset: int = 0) -> IoTicket:
        ptr, nbytes = tensor_span(tensor, "write buffer")
        return self._engine.write(str(path), ptr, nbytes, int(offset), tensor)

    def wait_all(self) -> int:
        return self._engine.wait_all()

    def register_buffer(self, tensor: torch.Tensor) -> bool:
        """Registers a long-lived buffer (e.g. from HostArena) as an io_uring fixed buffer
        when the config asks for registered buffers; False when not used. The engine keeps
        the tensor alive until unregister_buffer."""
        ptr, nbytes = tensor_span(tensor, "registered buffer")
        if not self._engine.register_buffer(ptr, nbytes):
            return False
        self._registered[ptr] = tensor
        return True

    def unregister_buffer(self, tensor: torch.Tensor) -> None:
        ptr = tensor.data_ptr()
        if self._registered.pop(ptr, None) is not None:
            self._engine.unregister_buffer(ptr)


def buffer_as_tensor(buffer: "_N.HostBuffer", numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A zero-copy tensor over an arena buffer; the tensor's storage owns the buffer."""
    raw = torch.from_dlpack(buffer.to_dlpack())
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    return raw[:nbytes].view(dtype)


DIRECT_ALIGN = 4096  # O_DIRECT's buffer alignment on the filesystems the engine meets


def aligned_empty(shape, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """An uninitialised tensor whose data starts on a DIRECT_ALIGN boundary (plain pageable
    memory: no arena, no budget). torch's allocator aligns to 64 B, and the engine reads or
    writes a buffer misaligned against its file offset through 1 MiB bounce buffers on its
    completion thread (1.1-1.7 GB/s on the dev VM's disk against 2.5-2.6 straight; Note [Bounce
    buffers]): large tensors that checkpoints or swap files move should come from here."""
    shape = torch.Size(shape if isinstance(shape, (tuple, list, torch.Size)) else (shape,))
    nbytes = shape.numel() * dtype.itemsize
    raw = torch.empty(nbytes + DIRECT_ALIGN, dtype=torch.uint8)
    skip = (-raw.data_ptr()) % DIRECT_ALIGN
    return raw[skip : skip + nbytes].view(dtype).view(shape)


# Set by zerostream.testing.sim_device while a test runs on the simulated device: told of
# every buffer handed out by an arena that registers its memory with the GPU.
registration_observer = None


class HostArena:
    """Page-locked host memory under one byte budget; over-budget requests wait.

    `register`: the buffers cross to a GPU (copy-stage slots, offloaded partitions, stage-3
    shards, their staging): registered with CUDA on a GPU machine, so copies from and to
    them are asynchronous DMA. Buffers that only go to disk or the CPU kernels are not.
    `pooled`: the whole budget is mapped, locked and registered once and buffers are carved
    out of it (Note [Pooled host arenas] in offload/host_arena.h): for arenas that hand out
    and take back buffers during a step. `lock` False (pin_memory false) neither locks nor
    registers."""

    def __init__(
        self, budget_bytes: int, lock: bool = True, register: bool = False, pooled: bool = False
    ):
        self.registers = bool(lock and register)
        self._arena = _N.HostArena(int(budget_bytes), lock, self.registers, pooled)
        _LIVE_ARENAS.add(self)

    def _handed_out(self, buf, numel: int, dtype: torch.dtype) -> torch.Tensor:
        t = buffer_as_tensor(buf, numel, dtype)
        if self.registers and registration_observer is not None:
            registration_observer(t)
        return t

    def empty(
        self, numel: int, dtype: torch.dtype = torch.uint8, timeout_s: float = 60.0
    ) -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements; its memory returns when torch frees it."""
        if numel < 0:
            raise ValueError(f"HostArena.empty: numel must be >= 0; got {numel}")
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        buf = self._arena.allocate(nbytes, float(timeout_s))
        return self._handed_out(buf, numel, dtype)

    def try_empty(self, numel: int, dtype: torch.dtype = torch.uint8) -> Optional[torch.Tensor]:
        """Like `empty`, but None instead of waiting when the budget is in use."""
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        buf = self._arena.try_allocate(nbytes)
        return None if buf is None else self._handed_out(buf, numel, dtype)

    def stats(self) -> dict:
        return self._arena.stats()


_LIVE_ARENAS: "weakref.WeakSet[HostArena]" = weakref.WeakSet()


def arena_totals() -> dict:
    """Budget, bytes in use and the sum of each arena's peak over the arenas alive in this
    process (the engine's swap buffers, staging, the aio handle's): what a run's summary
    reports as host-arena memory. The peaks are per arena, so their sum bounds the true
    simultaneous peak from above."""
    return _summed_stats(
        _LIVE_ARENAS,
        "arenas",
        (
            "budget",
            "in_use",
            "peak",
            "registrations",
            "registered",
            "register_failed",
            "pool_misses",
        ),
    )


def _summed_stats(objects, count_key: str, keys: tuple) -> dict:
    """{count_key: how many, key: the sum of each object's stats()[key]}."""
    live = list(objects)
    totals = {count_key: len(live), **{k: 0 for k in keys}}
    for obj in live:
        s = obj.stats()
        for k in keys:
            totals[k] += int(s[k])
    return totals


# Stores still open at interpreter exit are closed then: an engine kept alive by reference
# cycles until exit would otherwise leave its swap files (and its directory lock file).
_OPEN_STORES: "weakref.WeakSet[SwapStore]" = weakref.WeakSet()


@atexit.register
def _close_open_stores() -> None:
    for store in list(_OPEN_STORES):
        try:
            store.close()
        except Exception:  # exit is best effort; each store's own errors were raised earlier
            pass


class SwapStore:
    """A rank's swap files with an extent per tensor id (layout: ``offload/swap_store.h``)."""

    def __init__(
        self,
        engine: IoEngine,
        nvme_path: str,
        rank: int = 0,
        name: str = "swap",
        files: int = 4,
        align: int = 0,
        grow_bytes: int = 64 << 20,
        verify_checksums: bool = False,
    ):
        native = engine.native if isinstance(engine, IoEngine) else engine
        self._store = _N.SwapStore(
            native,
            str(nvme_path),
            int(rank),
            name,
            int(files),
            int(align),
            int(grow_bytes),
            bool(verify_checksums),
        )
        _OPEN_STORES.add(self)

    def write(self, tensor_id: int, tensor: torch.Tensor) -> IoTicket:
        ptr, nbytes = tensor_span(tensor, f"swap write of tensor {tensor_id}")
        return self._store.write(int(tensor_id), ptr, nbytes, tensor)

    def read(self, tensor_id: int, tensor: torch.Tensor) -> IoTicket:
        ptr, nbytes = tensor_span(tensor, f"swap read of tensor {tensor_id}")
        return self._store.read(int(tensor_id), ptr, nbytes, tensor)

    def free(self, tensor_id: int) -> None:
        self._store.free(int(tensor_id))

    def close(self) -> None:
        """Deletes the swap files and gives up the directory (also at interpreter exit)."""
        self._store.close()
        _OPEN_STORES.discard(self)

    def __contains__(self, tensor_id: int) -> bool:
        return self._store.contains(int(tensor_id))

    def bytes_needed(self, sizes) -> int:
        """Bytes the files grow by to hold tensors of `sizes` bytes (the allocator's rounding)."""
        return self._store.bytes_needed([int(s) for s in sizes])

    def require_space(self, sizes, key: str, sharing: int = 1) -> None:
        """Preflight: raises OSError(ENOSPC) naming `key`, the bytes needed and the bytes free
        when tensors of `sizes` bytes (times `sharing` ranks writing to the same filesystem)
        do not fit, before anything is written."""
        need = self.bytes_needed(sizes)
        total = need * max(1, int(sharing))
        free = self._store.free_bytes_on_disk()
        if free < 0 or total <= free:
            return
        ranks = f" ({sharing} ranks on this host x {need} bytes)" if sharing > 1 else ""
        raise OSError(
            errno.ENOSPC,
            f"{key}: the swap files under {self.directory} need {total} bytes{ranks} and the "
            f"filesystem has {free} bytes free ({total / 2**30:.2f} GiB needed, "
            f"{free / 2**30:.2f} GiB free); nothing was written. Free space, point {key} at a "
            f"larger device, or use more nodes.",
        )

    def size_of(self, tensor_id: int) -> int:
        return self._store.size_of(int(tensor_id))

    def extent_of(self, tensor_id: int) -> tuple[str, int, int]:
        """(file path, offset, reserved bytes)."""
        return self._store.extent_of(int(tensor_id))

    def stats(self) -> dict:
        return self._store.stats()

    @property
    def directory(self) -> str:
        return self._store.directory


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str, what: str = "size") -> int:
    """'4G', '1M', '512K', '1.5G', '1048576' -> bytes (binary units, as fio, ds_io and
    DeepSpeed's aio keys use); ValueError naming `what` otherwise."""
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in _UNITS else (t, "")
    try:
        value = int(float(num) * _UNITS[unit])
    except (ValueError, OverflowError):
        value = -1
    if value < 0:
        raise ValueError(f"{what}: expected bytes or a size like 64G, 1M or 4096; got {text!r}")
    return value


def ranks_on_this_host() -> int:
    """How many ranks of this job run on this host (and so write to one nvme_path's disk and
    share its memory): the launcher's count that ops/threads.py also divides the cores by."""
    from ..ops.threads import local_ranks

    return local_ranks()[0]


def store_totals() -> dict:
    """Bytes of live tensors (`used`) and the swap files' sizes (`files`, grown ahead of use)
    over the swap stores open in this process."""
    return _summed_stats(_OPEN_STORES, "stores", ("used_bytes", "file_bytes"))


def crc32c(tensor: torch.Tensor, crc: int = 0) -> int:
    """The CRC32C the swap store keeps per extent (zerostream.verify_swap_checksums), over a
    contiguous CPU tensor's bytes."""
    ptr, nbytes = tensor_span(tensor, "crc32c")
    return _N.crc32c(ptr, nbytes, int(crc))


def populate(tensor: torch.Tensor) -> torch.Tensor:
    """Faults in a contiguous CPU tensor's pages, bytes unchanged, before a read fills it
    (Note [Populate before reading] in offload/populate.h); returns the tensor."""
    ptr, nbytes = tensor_span(tensor, "populate")
    _N.populate(ptr, nbytes)
    return tensor


def crc32c_at(ptr: int, nbytes: int, crc: int = 0) -> int:
    """crc32c() over `nbytes` at address `ptr` (a buffer that is not a tensor)."""
    return _N.crc32c(int(ptr), int(nbytes), int(crc))


def set_io_fault(spec: Optional[str]) -> None:
    """Test only: make the Nth I/O attempt fail (``"3:EIO"``) or complete short (``"2:short"``).

    Same syntax as the ``ZS_IO_FAULT`` environment variable; ``None`` clears it.
    """
    if spec is None:
        _N._clear_io_fault()
    else:
        _N._set_io_fault(spec)


def io_faults_injected() -> int:
    return _N._io_faults_injected()


def warnings_emitted() -> list[str]:
    """Degraded modes reported so far (O_DIRECT refused, mlock refused, no io_uring)."""
    return list(_N.warnings_emitted())


def arena_bytes(nbytes: int) -> int:
    """What a request of `nbytes` takes from a HostArena budget: whole 4 KiB pages, at least
    one (offload/host_arena.cpp)."""
    page = 4096
    return max(page, (int(nbytes) + page - 1) // page * page)

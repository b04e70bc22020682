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

from typing import Optional

import torch

from zerostream import _C

_N = _C.offload

IoError = _N.IoError  # an OSError: .errno is set when the OS gave one
IoTicket = _N.IoTicket

BACKENDS = ("auto", "io_uring", "threads")


def io_config(block_size: int = 1 << 20, queue_depth: int = 32, intra_op_parallelism: int = 1,
              single_submit: bool = False, overlap_events: bool = True, backend: str = "auto",
              use_direct: bool = True, register_buffers: bool = False,
              register_files: bool = False) -> "_N.IoConfig":
    """An IoConfig from ds_config ``aio`` names (plus the extension key ``backend``)."""
    c = _N.IoConfig()
    c.block_size = int(block_size)
    c.queue_depth = int(queue_depth)
    c.threads = int(intra_op_parallelism)
    c.single_submit = bool(single_submit)
    c.overlap_events = bool(overlap_events)
    c.backend = backend  # raises ValueError naming aio.backend and the choices
    c.use_direct = bool(use_direct)
    c.register_buffers = bool(register_buffers)
    c.register_files = bool(register_files)
    c.validate()
    return c


# ds_config `aio` keys (DeepSpeed's defaults) and zerostream's extension key `backend`.
DS_AIO_DEFAULTS = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1,
                   "single_submit": False, "overlap_events": True, "use_gds": False,
                   "backend": "auto"}


def io_config_from_ds(aio: Optional[dict] = None) -> "_N.IoConfig":
    """Maps a ds_config ``aio`` section onto an IoConfig. Accepts the old name
    ``thread_count`` for ``intra_op_parallelism``; rejects unknown keys and ``use_gds``
    (GPUDirect Storage is not supported) with the key path in the message."""
    aio = dict(aio or {})
    if "thread_count" in aio:
        aio.setdefault("intra_op_parallelism", aio.pop("thread_count"))
    unknown = sorted(set(aio) - set(DS_AIO_DEFAULTS))
    if unknown:
        raise ValueError(f"aio: unknown keys {unknown}; expected some of {sorted(DS_AIO_DEFAULTS)}")
    merged = {**DS_AIO_DEFAULTS, **aio}
    if merged.pop("use_gds"):
        raise NotImplementedError("aio.use_gds: GPUDirect Storage is not supported by zerostream")
    return io_config(**merged)


def tensor_span(tensor: torch.Tensor, what: str = "tensor") -> tuple[int, int]:
    """(data pointer, bytes) of a contiguous CPU tensor; ValueError otherwise."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{what}: expected a torch.Tensor; got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{what}: expected a CPU tensor; got device {tensor.device}")
    if not tensor.is_contiguous():
        raise ValueError(f"{what}: expected a contiguous tensor (shape {tuple(tensor.shape)}, "
                         f"stride {tensor.stride()})")
    return tensor.data_ptr(), tensor.numel() * tensor.element_size()


class IoEngine:
    """Asynchronous reads and writes of tensors to files; one ticket per request."""

    def __init__(self, config: Optional["_N.IoConfig"] = None, **aio):
        self._engine = _N.IoEngine(config if config is not None else io_config(**aio))
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


class HostArena:
    """Page-locked host memory under one byte budget; over-budget requests wait."""

    def __init__(self, budget_bytes: int, lock: bool = True, cuda_register: bool = True):
        self._arena = _N.HostArena(int(budget_bytes), lock, cuda_register)

    def empty(self, numel: int, dtype: torch.dtype = torch.uint8,
              timeout_s: float = 60.0) -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements; its memory returns when torch frees it."""
        if numel < 0:
            raise ValueError(f"HostArena.empty: numel must be >= 0; got {numel}")
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        buf = self._arena.allocate(nbytes, float(timeout_s))
        return buffer_as_tensor(buf, numel, dtype)

    def stats(self) -> dict:
        return self._arena.stats()


class SwapStore:
    """A rank's swap files with an extent per tensor id (layout: ``offload/swap_store.h``)."""

    def __init__(self, engine: IoEngine, nvme_path: str, rank: int = 0, name: str = "swap",
                 files: int = 4, align: int = 0, grow_bytes: int = 64 << 20,
                 verify_checksums: bool = False):
        native = engine.native if isinstance(engine, IoEngine) else engine
        self._store = _N.SwapStore(native, str(nvme_path), int(rank), name, int(files),
                                   int(align), int(grow_bytes), bool(verify_checksums))

    def write(self, tensor_id: int, tensor: torch.Tensor) -> IoTicket:
        ptr, nbytes = tensor_span(tensor, f"swap write of tensor {tensor_id}")
        return self._store.write(int(tensor_id), ptr, nbytes, tensor)

    def read(self, tensor_id: int, tensor: torch.Tensor) -> IoTicket:
        ptr, nbytes = tensor_span(tensor, f"swap read of tensor {tensor_id}")
        return self._store.read(int(tensor_id), ptr, nbytes, tensor)

    def free(self, tensor_id: int) -> None:
        self._store.free(int(tensor_id))

    def __contains__(self, tensor_id: int) -> bool:
        return self._store.contains(int(tensor_id))

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

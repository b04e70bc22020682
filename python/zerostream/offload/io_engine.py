"""zerostream's asynchronous file I/O over torch tensors: the native engine
(``zerostream._C.offload``, offload/io_engine.h) and the one mapping from a ds_config's
``aio`` section to its config.

The native engine works on (pointer, bytes); this module turns CPU tensors into those
(host_buffers.tensor_span) and keeps each tensor alive in the request's ticket until the
I/O is over (see Note [Buffer lifetime] in ``csrc/bindings/offload_bindings.cpp``).
``zerostream.ops.aio`` builds DeepSpeed's ``aio_handle`` on top of it; swap_store.py keeps a
rank's swap files with it.

    engine = IoEngine(block_size=1 << 20, queue_depth=32)
    engine.write(aligned_empty(1 << 20), "/nvme/x.bin").wait()   # wait() for this request only
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Optional

import torch

from zerostream import _C

from .host_buffers import tensor_span

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


def warnings_emitted() -> list[str]:
    """Degraded modes reported so far (O_DIRECT refused, mlock refused, no io_uring)."""
    return list(_N.warnings_emitted())

"""A rank's swap files on NVMe: one extent per tensor id, written and read through an
IoEngine, optionally checksummed (layout: offload/swap_store.h). The optimizer and parameter
swappers (optimizer_swap.py, zero/stage3/param_swap.py) keep their tensors here.

    store = SwapStore(IoEngine(), "/nvme", rank=0, name="optimizer")
    store.write(7, buf).wait()                          # wait() for this request only
    store.read(7, buf).wait()
"""

from __future__ import annotations

import atexit
import errno
import weakref

import torch

from zerostream import _C

from .host_buffers import tensor_span
from .io_engine import IoEngine, IoTicket

_N = _C.offload

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


def store_totals() -> dict:
    """Bytes of live tensors (`used`) and the swap files' sizes (`files`, grown ahead of use)
    over the swap stores open in this process."""
    stats = [store.stats() for store in list(_OPEN_STORES)]
    totaled = ("used_bytes", "file_bytes")
    return {"stores": len(stats), **{k: sum(int(s[k]) for s in stats) for k in totaled}}

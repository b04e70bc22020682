"""Test only: make the I/O engine's Nth attempt fail or complete short (offload/fault_injection.h),
to exercise the retry and error paths of the engine and its users."""

from __future__ import annotations

from typing import Optional

from zerostream import _C


def set_io_fault(spec: Optional[str]) -> None:
    """Make the Nth I/O attempt fail (``"3:EIO"``) or complete short (``"2:short"``).

    Same syntax as the ``ZS_IO_FAULT`` environment variable; ``None`` clears it.
    """
    if spec is None:
        _C.offload._clear_io_fault()
    else:
        _C.offload._set_io_fault(spec)


def io_faults_injected() -> int:
    return _C.offload._io_faults_injected()

"""Host-memory preflight (reliability item 5): before an offloaded optimizer allocates its fp32
state in host memory, the bytes it will need are compared with what this process may still
use, so a model that does not fit fails with both numbers and what to change, instead of being
killed by the OOM killer with no message.

What the process may use is the smaller of the kernel's MemAvailable (/proc/meminfo) and the
room left under its cgroup's memory limit (v2: memory.max - memory.current of its cgroup and
every ancestor; v1: memory.limit_in_bytes - memory.usage_in_bytes). The environment variable
ZEROSTREAM_HOST_MEMORY_LIMIT (bytes, or a size such as "64G") replaces that reading: for
tests, and for a user who knows better (another job will need the memory).
"""

from __future__ import annotations

import os
import zlib
from typing import Dict, Optional, Tuple

from ..comm import ranks_on_this_host

ENV = "ZEROSTREAM_HOST_MEMORY_LIMIT"
SKEW_ENV = "ZEROSTREAM_TEST_SKEW"


def skewed(value, kind: str):
    """`value`, a reading that feeds an "auto" decision (free host or device memory, a
    step's measured excess, a measured wait), as this rank reads it. Under
    ZEROSTREAM_TEST_SKEW=<f> (tests: the rank-asymmetry mode) it is scaled by a factor in
    [1 - f, 1], different for each rank and each kind of reading and the same on every
    call, so ranks read different numbers as on a real host (Note [Every rank places the
    same tiers] in offload/placement/__init__.py). Unset, the reading as it is."""
    text = os.environ.get(SKEW_ENV)
    if not text or value is None:
        return value
    try:
        amount = float(text)
    except ValueError:
        amount = -1.0
    if not 0.0 <= amount < 1.0:
        raise ValueError(f"{SKEW_ENV}: expected a fraction in [0, 1); got {text!r}")
    rank = int(os.environ.get("RANK", "0"))
    phase = (zlib.crc32(kind.encode()) / 2**32 + 0.382 * (rank + 1)) % 1.0
    scaled = value * (1.0 - amount * phase)
    return type(value)(scaled) if isinstance(value, int) else scaled


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


def mem_available(meminfo: str = "/proc/meminfo") -> Optional[int]:
    """MemAvailable in bytes, or None where the kernel does not say."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    value, unit = line.split()[1:3]
                    return int(value) * (1024 if unit.lower() == "kb" else 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= 1 << 60 else value  # v1 writes "no limit" as a huge number


def cgroup_room(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> Optional[int]:
    """Bytes left under this process's cgroup memory limit (the tightest of its cgroup and
    its ancestors), or None when no limit applies or none can be read."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    rooms = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: walk up from the process's cgroup to the root
            d = os.path.join(root, path.lstrip("/"))
            while True:
                limit = _read_int(os.path.join(d, "memory.max"))
                used = _read_int(os.path.join(d, "memory.current"))
                if limit is not None:
                    rooms.append(limit - (used or 0))
                if os.path.normpath(d) == os.path.normpath(root):
                    break
                d = os.path.dirname(d)
        elif "memory" in controllers.split(","):  # v1
            base = os.path.join(root, "memory")
            for d in (os.path.join(base, path.lstrip("/")), base):
                limit = _read_int(os.path.join(d, "memory.limit_in_bytes"))
                used = _read_int(os.path.join(d, "memory.usage_in_bytes"))
                if limit is not None:
                    rooms.append(limit - (used or 0))
                    break
    return max(0, min(rooms)) if rooms else None


def memory_status() -> Dict[str, int]:
    """VmRSS and VmHWM (peak) of this process, in bytes; {} where /proc has no such lines."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def restart_peak() -> bool:
    """Restarts VmHWM from the current RSS (Linux: clear_refs 5); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def usable_host_bytes() -> Tuple[Optional[int], str]:
    """(bytes this process may still allocate, where the number comes from); None when
    nothing can be read (the preflight then stays out of the way)."""
    override = os.environ.get(ENV)
    if override:
        return skewed(parse_bytes(override, ENV), "usable"), ENV
    available, room = mem_available(), cgroup_room()
    if room is not None and (available is None or room < available):
        return skewed(room, "usable"), "the cgroup memory limit"
    return skewed(available, "usable"), "MemAvailable"


def require_host_memory(need: int, what: str, advice: str) -> None:
    """Raises MemoryError naming `what`, the bytes needed, the bytes usable and `advice`
    when `need` is more than this process may allocate."""
    usable, source = usable_host_bytes()
    if usable is None or need <= usable:
        return
    raise MemoryError(
        f"{what} needs {need / 2**30:.2f} GiB of host memory ({need} bytes) and this process "
        f"may use {usable / 2**30:.2f} GiB ({usable} bytes, from {source}); nothing was "
        f"allocated. {advice}"
    )


def require_host_memory_everywhere(
    need: int, what: str, advice: str, *, group, world: int, device
) -> None:
    """require_host_memory on every rank of `group` before any of them allocates: the
    verdicts are all-reduced (which also keeps a rank from allocating while another is still
    reading MemAvailable), so every rank raises and none waits in a collective."""
    from .. import comm

    error: Optional[MemoryError] = None
    try:
        require_host_memory(need, what, advice)
    except MemoryError as e:
        error = e
    short = comm.first_failed_rank(error is not None, group=group, world=world, device=device)
    rank = comm.get_rank()
    if error is not None:
        raise MemoryError(f"[rank {rank}] {error}")
    if short >= 0:
        raise MemoryError(
            f"[rank {rank}] stopping: global rank {short} does not have the host memory its "
            f"{what} needs (its error gives the numbers)"
        )


def require_state_memory(
    numel: int, per_element: int, what: str, advice: str, *, group, world: int, device
) -> None:
    """require_host_memory_everywhere for optimizer state of `numel` elements per rank at
    `per_element` bytes each, times the ranks of this host (which allocate the same); the
    error names `what` with that arithmetic."""
    local = ranks_on_this_host()
    ranks = f" x {local} ranks on this host" if local > 1 else ""
    require_host_memory_everywhere(
        per_element * numel * local,
        f"{what} ({numel} elements per rank x {per_element} bytes{ranks})",
        advice,
        group=group,
        world=world,
        device=device,
    )

"""`"zerostream": {"host_malloc": "retain"}`: freed host memory stays in the process for the
next step instead of going back to the kernel (Note [Fresh pages cost more than the math]).

Note [Fresh pages cost more than the math]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
glibc's malloc serves every allocation above its mmap threshold (at most 32 MiB) with a
fresh mmap and unmaps it on free. A CPU training step allocates many such tensors and frees
them again: the gathered stage-3 parameters, a bf16 model's fp32 casts, the weight gradients.
Each first touch of a fresh page traps into the kernel, which zeroes it: on this project's
VM that costs about 0.4 s a GB, eight times the cost of writing the bytes themselves; the
3.17 B bench's forward and backward (all on NVMe) took 36-48 s a step with glibc's policy
and 18-25 s with "retain", bit-identical losses (benchmarks/capacity.md).
On a GPU the caching allocator keeps device blocks for reuse; "retain" does the same for
the host heap: mmap is off for malloc (M_MMAP_MAX 0: big blocks come from the heap) and the
heap's top is never trimmed (M_TRIM_THRESHOLD at its largest), so a step's freed tensors
are the next step's, pages already mapped. PyTorch's own CPU launcher
(torch.backends.xeon.run_cpu) gets the same effect by preloading jemalloc or tcmalloc; this
needs no other library.

The cost: the process keeps its high-water mark of heap memory (RSS does not fall after a
step), and the heap can still grow where a later step's blocks do not fit the holes the
earlier ones left (glibc splits big free blocks; an 8-layer bench step's peak RSS rose 15%).
Two consequences:
- "auto" tiers size themselves from what a measured step needs above what it leaves (Note
  [A step's excess] in offload/placement/window.py), and a retained heap leaves what it
  needed: the 3.17 B tiered bench, measuring none, ran out of memory. So while
  any "auto" tier is still to be placed, each step's end gives the free heap pages back
  (malloc_trim) before the step's window closes: the window's peak is the step's with
  "retain" (its holes included), what it leaves is what is live, and the tiers are sized
  from the difference; once they are placed the heap is kept again. A tier places itself
  inside a later step, after the heap grew back: it gives the free pages back there too
  before it reads the RSS and the usable memory (StepWindow.before_placing), or it would
  count that heap twice, once as memory not available and once in the excess.
- A safety valve: at each step end, if what this process may still allocate
  (memory_preflight.usable_host_bytes) is below VALVE_BYTES plus the excess an "auto" tier
  measured (valve_bytes), malloc_trim gives the free pages back to the kernel (counted in
  trims(); the next step faults them in again) instead of letting the heap's holes push
  the machine out of memory. The excess is in it because the heap creeps: blocks that do
  not fit the holes earlier ones left take new pages, step after step (the 3.17 B bench's
  all-NVMe run went from 14.3 to 17.4 GiB over ten steps), and "auto" leaves only a step's
  excess and its reserve free. With a valve of VALVE_BYTES alone the tiered bench was
  killed for memory after its tiers were placed; a step that starts with a
  step's excess free fits even if it reuses no hole. So that the valve does not then open
  at every step end (and "retain" gain nothing), "auto" leaves room for both while
  "retain" holds: the heap it keeps (about a step's excess) and a step's excess free
  (placement/budgets.measured_budget_bytes).
engine.destroy() gives the free pages back and puts glibc's defaults back when the last
engine that asked for "retain" ends. The host arenas of the offload tier (page-locked
staging, the host tiers) are mmap'ed by the native core and are unaffected.

"system" (the default) changes nothing. On a libc other than glibc "retain" is refused by
name: its mallopt does not mean the same.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from typing import Optional

logger = logging.getLogger("zerostream")

KEY = "zerostream.host_malloc"
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# glibc's defaults (malloc/malloc.c): a 128 KiB trim threshold, 65536 mmapped chunks. Setting
# either fixes the dynamic mmap threshold, which restoring them does not undo.
_DEFAULT_TRIM = 128 * 1024
_DEFAULT_MMAP_MAX = 65536
_LARGEST = (1 << 31) - 1  # mallopt takes an int

# The valve: below this much memory left to allocate, the retained free pages go back.
VALVE_BYTES = 512 << 20

_lock = threading.Lock()
_holders = 0
_trims = 0
_placement_trims = 0


def _glibc():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not hasattr(libc, "gnu_get_libc_version"):
        raise ValueError(
            f'{KEY}: "retain" needs glibc\'s malloc (its mallopt settings); this process '
            'runs on another libc: use "system"'
        )
    return libc


def _engage(libc) -> None:
    if not (libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, _LARGEST)):
        raise RuntimeError(f'{KEY} "retain": glibc refused mallopt')
    logger.info(
        '%s "retain": freed host memory stays in this process for the next step '
        "(no fresh pages to fault in); engine.destroy() gives it back",
        KEY,
    )


def retain() -> None:
    """Freed heap memory stays for reuse (Note [Fresh pages cost more than the math]); one
    call per engine, undone by the matching release()."""
    global _holders
    with _lock:
        libc = _glibc()
        if _holders == 0:
            _engage(libc)
        _holders += 1


def give_back_for_placement() -> None:
    """The free heap pages back to the kernel while "retain" holds, before an "auto" tier
    reads the memory it places itself in (Note [A step's excess] in
    offload/placement/window.py); counted in placement_trims(). Nothing otherwise."""
    global _placement_trims
    with _lock:
        if _holders:
            _glibc().malloc_trim(0)
            _placement_trims += 1


def valve_bytes(step_excess) -> int:
    """Below this much memory left to allocate at a step's end the retained heap goes back:
    VALVE_BYTES, plus what a step was measured to need above what it leaves (`step_excess`,
    from an "auto" tier's measurement; None where none was made). A retained heap reuses its
    holes only where the next blocks fit them and can creep upward from step to step (the
    3.17 B bench's all-NVMe run: 14.3 -> 17.4 GiB over ten steps); a step that starts with a
    step's excess free fits even if it reuses nothing."""
    return VALVE_BYTES + (step_excess or 0)


def settle(tiers_waiting: bool, step_excess: Optional[int] = None) -> None:
    """A step ended, its window not yet closed (Note [A step's excess]): while "auto" tiers
    wait to be placed the free heap pages go back, so the window measures what the step
    needed above what is live; otherwise the valve opens if memory runs short (the Note)."""
    global _trims
    if not _holders:
        return
    with _lock:
        libc = _glibc()
        if tiers_waiting:
            libc.malloc_trim(0)
            return
        from .offload.memory_preflight import usable_host_bytes

        usable, where = usable_host_bytes()
        if usable is not None and usable < valve_bytes(step_excess):
            libc.malloc_trim(0)
            _trims += 1
            if _trims == 1:
                logger.info(
                    '%s "retain": %s %.2f GiB, under %.2f GiB: the free heap pages go back to '
                    "the kernel (each time it happens again: trims() counts them)",
                    KEY,
                    where,
                    usable / 2**30,
                    VALVE_BYTES / 2**30,
                )


def release() -> None:
    """The end of one engine that called retain(): the last one gives the free pages back
    and restores glibc's defaults."""
    global _holders
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders:
            return
        libc = _glibc()
        libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
        libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM)
        libc.malloc_trim(0)


def holders() -> int:
    """How many engines hold "retain" now (tests)."""
    return _holders


def trims() -> int:
    """How many times the valve gave the free pages back (tests, benches)."""
    return _trims


def placement_trims() -> int:
    """How many times an "auto" placement had the free pages given back first (tests)."""
    return _placement_trims

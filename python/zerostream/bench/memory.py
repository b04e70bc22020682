"""This process's resident memory for the benchmarks: VmRSS and its peak VmHWM from
/proc/self/status, and a restart of that peak (clear_refs 5).

Note [A child's peak RSS]
  getrusage's ru_maxrss of a process started by fork + exec keeps the parent's resident size
  at the fork (Linux carries the old address space's high-water mark across exec), so a
  benchmark worker launched from a large process (a test run at 1 GiB) reported at least that
  as its own peak. Workers therefore restart the peak when they begin and read VmHWM.
"""

from __future__ import annotations

import resource

from ..offload.memory_preflight import (
    memory_status,  # noqa: F401 (this module's API)
    restart_peak,
)
from ..offload.placement import window


def reset_peak() -> bool:
    """Restarts VmHWM from the current RSS (Linux: clear_refs 5), and the peak the "auto"
    tiers kept from their own restarts; False where refused."""
    window.forget_process_peak()
    return restart_peak()


def peak_rss_bytes() -> int:
    """This process's peak RSS since it began or since reset_peak(): VmHWM (with the peak
    from before the restarts of Note [A step's excess]), or ru_maxrss where /proc does not
    say (see Note [A child's peak RSS])."""
    peak = window.process_peak_bytes()
    if peak is not None:
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

"""--bind_cores_to_rank: this node's cores split into one disjoint set per local rank.

DeepSpeed's rule (`get_numactl_cmd`): the cores are taken in order and each local rank gets
`len(cores) // nproc` consecutive ones; a remainder is left unused. The cores are the ones
this launcher may run on (its affinity mask: a container's cpuset or a SLURM allocation, not
every CPU of the machine) or --bind_core_list. The child applies its set with
`os.sched_setaffinity` before the user's program starts and sets OMP_NUM_THREADS to its size.
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence


def parse_core_list(
    text: str, flag: str = "--bind_core_list", ascending: bool = False
) -> List[int]:
    """`1,3-5,7` -> [1, 3, 4, 5, 7]: order kept, repeats refused. `ascending` also refuses an
    item that does not start after the previous one ends (DeepSpeed's `parse_range_list`)."""
    cores: List[int] = []
    for item in text.split(","):
        first, dash, last = item.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{flag} {text}: {item!r} is not a core id or a range like 3-5")
        lo, hi = int(first), int(last) if dash else int(first)
        if hi < lo:
            raise ValueError(f"{flag} {text}: range {item!r} runs backwards")
        if ascending and cores and lo <= cores[-1]:
            raise ValueError(
                f"{flag} {text}: {item!r} starts at or before core {cores[-1]}, where the item "
                f"before it ends; list the cores in ascending order without overlaps"
            )
        cores.extend(range(lo, hi + 1))
    if len(set(cores)) != len(cores):
        raise ValueError(f"{flag} {text}: a core is listed twice")
    return cores


def format_ranges(cores: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> `0-2,5,7-8`, the inverse of parse_core_list (numactl's -C form)."""
    runs: List[List[int]] = []
    for core in cores:
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def available_cores() -> List[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: every CPU
        return list(range(os.cpu_count() or 1))


def core_pool(core_list: Optional[str], ascending: bool = False) -> List[int]:
    """The cores --bind_cores_to_rank splits: --bind_core_list's, else all this process may
    use."""
    return parse_core_list(core_list, ascending=ascending) if core_list else available_cores()


def split_cores(cores: Sequence[int], nproc: int) -> List[List[int]]:
    """One disjoint, equal-sized list of cores per local rank."""
    if len(cores) < nproc:
        raise ValueError(
            f"--bind_cores_to_rank: {len(cores)} core(s) ({format_cores(cores)}) for {nproc} "
            f"local ranks; each rank needs at least one (start fewer ranks or give "
            f"--bind_core_list)"
        )
    per_rank = len(cores) // nproc
    return [list(cores[r * per_rank : (r + 1) * per_rank]) for r in range(nproc)]


def format_cores(cores: Sequence[int]) -> str:
    return ",".join(str(c) for c in cores)

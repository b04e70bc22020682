"""--bind_cores_to_rank: this node's cores split into one disjoint set per local rank.

DeepSpeed's rule (`get_numactl_cmd`): the cores are taken in order and each local rank gets
`len(cores) // nproc` consecutive ones; a remainder is left unused. The cores are the ones
this launcher may run on (its affinity mask: a container's cpuset or a SLURM allocation, not
every CPU of the machine) or --bind_core_list. The child applies its set with
`os.sched_setaffinity` before the user's program starts and sets OMP_NUM_THREADS to its size.
"""

from __future__ import annotations

import os
from typing import List, Sequence


def parse_core_list(text: str, flag: str = "--bind_core_list") -> List[int]:
    """`1,3-5,7` -> [1, 3, 4, 5, 7]: order kept, repeats refused."""
    cores: List[int] = []
    for item in text.split(","):
        first, dash, last = item.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{flag} {text}: {item!r} is not a core id or a range like 3-5")
        lo, hi = int(first), int(last) if dash else int(first)
        if hi < lo:
            raise ValueError(f"{flag} {text}: range {item!r} runs backwards")
        cores.extend(range(lo, hi + 1))
    if len(set(cores)) != len(cores):
        raise ValueError(f"{flag} {text}: a core is listed twice")
    return cores


def available_cores() -> List[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: every CPU
        return list(range(os.cpu_count() or 1))


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

"""`deepspeed.utils.numa`: core lists and the numactl prefix that binds a rank to its cores
(zerostream/launcher/cores.py and numa.py).

Differences from DeepSpeed: the NUMA nodes are read from sysfs, not from `numactl
--hardware`; without a core list the cores split are those this process may run on (its
affinity mask: a container's or a SLURM allocation's), not the machine's physical core count.
"""

from __future__ import annotations

import shutil
from typing import List, Optional, Tuple

from zerostream.launcher import cores, numa

from .logging import logger


def get_numa_cores() -> List[List[int]]:
    """The CPUs of each NUMA node, by node id ([] for a memory-only node)."""
    return list(numa.node_cpus().values())


def check_for_numactl_pkg() -> bool:
    found = shutil.which("numactl") is not None
    if not found:
        logger.warning("numactl is not on PATH: install the numactl package")
    return found


def parse_range(rng: str) -> range:
    """`3` or `3-5`, bounds included."""
    if "," in rng:
        raise ValueError(f"core range {rng!r}: one number or one range like 3-5, no commas")
    listed = cores.parse_core_list(rng, flag="core range")
    return range(listed[0], listed[-1] + 1)


def parse_range_list(range_str: str) -> List[int]:
    """`0,2-4,6` -> [0, 2, 3, 4, 6]; items ascending and not overlapping, else ValueError."""
    return cores.parse_core_list(range_str, flag="core list", ascending=True)


def get_numactl_cmd(
    bind_core_list: Optional[str], num_local_procs: int, local_rank: int
) -> Tuple[int, List[str]]:
    """(cores per rank, `numactl [-m N | -p N] -C CORES`) for one of a node's local ranks."""
    check_for_numactl_pkg()
    pool = cores.core_pool(bind_core_list, ascending=True)
    return numa.rank_binding(pool, num_local_procs, local_rank)


__all__ = [
    "get_numa_cores",
    "check_for_numactl_pkg",
    "parse_range",
    "parse_range_list",
    "get_numactl_cmd",
]

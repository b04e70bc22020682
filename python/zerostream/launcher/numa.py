"""`numactl` in front of a rank a cluster launcher starts itself (--launcher impi with
--bind_cores_to_rank, DeepSpeed's `get_numactl_cmd`): its cores (`-C`) and where its memory
goes.

Ranks `zerostream run` starts through its own agent bind with `os.sched_setaffinity`
(_child.py); an MPI starts the user's program directly, so the binding has to be a program
in front of it. The cores come from cores.py (the same split: `len(cores) // nproc`
consecutive cores per local rank). The memory policy follows the machine's NUMA nodes, read
from sysfs (/sys/devices/system/node/nodeN/cpulist; a node with no CPUs is memory only):

- the rank's cores all lie in one node: `-m NODE`, its memory stays next to its cores;
- fake NUMA (several nodes listing the same CPUs, one socket's memory split): `-m A,B`, all
  the nodes of those CPUs;
- flat-mode HBM (as many CPU-less nodes as nodes with CPUs, the i-th CPU-less one the HBM of
  the i-th with CPUs): `-p HBM`, the high-bandwidth memory preferred, DDR when it is full;
- cores spread over several nodes: no memory policy, the kernel's default.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from . import cores as cores_mod

SYSFS_NODES = "/sys/devices/system/node"


def node_cpus(root: str = SYSFS_NODES) -> Dict[int, List[int]]:
    """{NUMA node: its CPUs} of this machine, empty where sysfs has no node list (not Linux)."""
    out: Dict[int, List[int]] = {}
    for path in sorted(glob.glob(os.path.join(root, "node[0-9]*", "cpulist"))):
        node = int(re.search(r"node(\d+)", os.path.basename(os.path.dirname(path))).group(1))
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
        out[node] = cores_mod.parse_core_list(text, flag=path, ascending=True) if text else []
    return dict(sorted(out.items()))


def memory_policy(cores: Sequence[int], nodes: Mapping[int, Sequence[int]]) -> List[str]:
    """numactl's memory flags for a rank on `cores` (the rules in the module docstring)."""
    wanted = set(cores)
    home = next((n for n, cpus in nodes.items() if cpus and wanted <= set(cpus)), None)
    if home is None:
        return []
    with_cpus = [n for n, cpus in nodes.items() if cpus]
    memory_only = [n for n, cpus in nodes.items() if not cpus]
    if memory_only and len(memory_only) == len(with_cpus):
        return ["-p", str(memory_only[with_cpus.index(home)])]
    twins = [n for n, cpus in nodes.items() if list(cpus) == list(nodes[home])]
    return ["-m", ",".join(str(n) for n in twins)]


def numactl_argv(cores: Sequence[int], nodes: Mapping[int, Sequence[int]]) -> List[str]:
    """`numactl [-m N | -p N] -C CORES` for one rank."""
    return ["numactl", *memory_policy(cores, nodes), "-C", cores_mod.format_ranges(cores)]


def check_environment(environ: Mapping[str, str]) -> None:
    """Intel OpenMP's own pinning (KMP_AFFINITY) overrides the cores numactl gives a rank."""
    if "KMP_AFFINITY" in environ:
        raise ValueError(
            f"KMP_AFFINITY={environ['KMP_AFFINITY']!r} is set: Intel OpenMP would pin the "
            f"rank's threads itself and override the cores --bind_cores_to_rank gives it; "
            f"unset KMP_AFFINITY"
        )


def rank_binding(
    pool: Sequence[int],
    nproc: int,
    local_rank: int,
    nodes: Optional[Mapping[int, Sequence[int]]] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> Tuple[int, List[str]]:
    """(cores per rank, numactl argv) for local rank `local_rank` of `nproc`: its share of
    `pool` (cores.core_pool) as cores.py splits it; `nodes` defaults to this machine's NUMA
    nodes."""
    check_environment(os.environ if environ is None else environ)
    if not 0 <= local_rank < nproc:
        raise ValueError(f"local rank {local_rank}: expected 0-{nproc - 1} ({nproc} local ranks)")
    mine = cores_mod.split_cores(pool, nproc)[local_rank]
    return len(mine), numactl_argv(mine, node_cpus() if nodes is None else nodes)

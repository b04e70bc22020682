"""How many threads the CPU optimizers (and the gradient-statistics pass) run on.

The step of ZeRO-Offload is bound by memory bandwidth, which scales with the cores that
stream it, so the default is every core this process may run on, shared out among the
ranks of this node. The usual trap this avoids: torchrun sets ``OMP_NUM_THREADS=1`` for
every multi-process job (a setting meant for torch's intra-op pools), which would leave an
8-rank node's CPU optimizers on 8 of its cores (DeepSpeed's #1635 and its
``--bind_cores_to_rank`` advice).

Resolution, first match wins:

1. ``threads=`` given to the optimizer or kernel call (> 0);
2. ``ZS_OPTIM_THREADS`` in the environment;
3. ``OMP_NUM_THREADS``, unless it is torchrun's multi-process default (``1`` with more than
   one local rank);
4. the cores in this process's affinity mask, divided by the ranks on this node
   (``LOCAL_WORLD_SIZE`` from torchrun, ``LOCAL_SIZE`` from DeepSpeed's launcher,
   ``OMPI_COMM_WORLD_LOCAL_SIZE`` from Open MPI) when the ranks share it, at least 1. A mask
   no larger than one rank's share of the machine's CPUs is taken as this rank's own
   (numactl or SLURM per-rank binding) and used whole; a larger one (all CPUs, a container's
   cpuset) is shared. DeepSpeed's ``--bind_cores_to_rank`` also sets ``OMP_NUM_THREADS``.

The resolved count and its reason are logged once (logger ``zerostream``, INFO).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Dict, Optional, Tuple

from ..comm import LOCAL_SIZE_VARS, local_ranks

_ENV_VARS = ("ZS_OPTIM_THREADS", "OMP_NUM_THREADS") + LOCAL_SIZE_VARS
_cache: Dict[tuple, Tuple[int, str]] = {}
_logged = set()


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}: expected a positive integer (threads); got {text!r}")
    return value


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def resolve(threads: Optional[int] = None) -> Tuple[int, str]:
    """(thread count, why) for a CPU optimizer call; see the module docstring."""
    if threads:
        return int(threads), "threads= argument"
    key = (tuple(os.environ.get(v) for v in _ENV_VARS), _cores())
    if key not in _cache:
        _cache[key] = _resolve_from_env()
    return _cache[key]


def _resolve_from_env() -> Tuple[int, str]:
    text = os.environ.get("ZS_OPTIM_THREADS")
    if text:
        return _positive_int("ZS_OPTIM_THREADS", text), "ZS_OPTIM_THREADS"
    ranks, ranks_var = local_ranks()
    omp = os.environ.get("OMP_NUM_THREADS")
    if omp:
        first = omp.split(",")[0].strip()  # a nested list "4,2": the outer level
        if not (first == "1" and ranks > 1):
            return _positive_int("OMP_NUM_THREADS", first), "OMP_NUM_THREADS"
    cores = _cores()
    if ranks == 1:
        return cores, f"{cores} cores available"
    machine = os.cpu_count() or cores
    if cores * ranks <= machine:
        return cores, f"{cores} cores bound to this rank"
    return max(
        1, cores // ranks
    ), f"{cores} cores available / {ranks} ranks on this node ({ranks_var})"


def optimizer_threads(threads: Optional[int] = None) -> int:
    """The thread count to pass to a native optimizer call; logs the choice once. On a thread
    that leaves a core to the one driving the device (leave_one_core), one fewer (at least 1)."""
    count, why = resolve(threads)
    if (count, why) not in _logged and not threads:
        _logged.add((count, why))
        logging.getLogger("zerostream").info("CPU optimizer: %d threads (%s)", count, why)
    return max(1, count - getattr(_local, "leave", 0))


_local = threading.local()


def leave_one_core() -> None:
    """From now on, native optimizer calls made on the calling thread use one core fewer: a
    thread updating beside the backward (zero/speculate.py) must not take the core of the
    thread that runs autograd and launches the device's kernels (DeepSpeed's ZenFlow reserves
    cores for the same reason, pt_reserved_cores_perc)."""
    _local.leave = 1

"""pt_reserved_cores_perc: how ZenFlow shares a rank's cores between training and the host
optimizer update."""

from __future__ import annotations

import math
import os
from typing import List, Sequence, Tuple


def split_affinity(cores: Sequence[int], pt_reserved_cores_perc: float) -> Tuple[List, List]:
    """(optimizer cores, training cores): DeepSpeed's rule (zenflow_utils._split_affinity) is
    that training keeps the first ceil(perc * n) cores and the optimizer update gets the
    rest; when that reserve is empty or takes every core, both use all of them (an empty
    side has nothing to run on)."""
    cores = list(cores)
    reserved = math.ceil(pt_reserved_cores_perc * len(cores))
    if 0 < reserved < len(cores):
        return cores[reserved:], cores[:reserved]
    return cores, cores


def optimizer_threads(pt_reserved_cores_perc: float) -> int:
    """Threads the overlapped host update runs with: the optimizer's share of the cores this
    process may run on. (DeepSpeed also pins its optimizer process to those cores and the
    training process to the rest; zerostream's update is a thread of the training process,
    so only the count applies.)"""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not cores:
        cores = list(range(os.cpu_count() or 1))
    return max(1, len(split_affinity(cores, pt_reserved_cores_perc)[0]))

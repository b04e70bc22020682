"""Agreements the ranks reach on the host, without a device-to-host read.

Note [Agreements on the host]
  A few per-step decisions need every rank's view: which gradient buckets hold parts that
  came late (zero/grad_reduce.py), which stage-3 unit is gathered next while no trace is
  replayed (zero/stage3/coordinator.py), the "auto" tiers' budgets. Their inputs are host
  facts (hooks seen, modules entered, memory read), yet on NCCL an all-reduce needs a device
  tensor, and reading its result (`.item()`, `.tolist()`) makes the host wait until the
  compute stream has run everything queued before it: the rest of backward, a forward's
  kernels. The host then stops queueing work and the GPU runs dry behind it, once a
  backward for the late parts and once a pass for stage 3's round.

  So an agreement goes over a process group that reduces CPU tensors on the host:
  - a Gloo group, or one made with a CPU backend beside NCCL ("cpu:gloo,cuda:nccl"): itself;
  - an NCCL-only group: a Gloo twin over the same ranks, made by `prepare` when the engine
    is built (every rank builds one, so every member makes the twin together; torch's
    `use_local_synchronization` lets a data-parallel subgroup make its own without the
    ranks outside it);
  - a twin that could not be made on some rank is made on none (the ranks agree on it once,
    on the device): they keep the device path, as before.
  The twin orders nothing on the device: its collectives run on the host in program order,
  each rank issuing them where it issued the device reduction before, so the sequence every
  rank issues stays the same (Note [Ranks that issue different collectives]).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

import torch.distributed as dist

logger = logging.getLogger("zerostream")

# group (dist.group.WORLD for None) -> its host group, or None where it has none. Keyed
# together with the default group it belongs to: a destroyed world drops its twins.
_TWINS: Dict[Any, Optional[Any]] = {}
_WORLD: list = [None]


def _key(group):
    world = dist.group.WORLD
    if _WORLD[0] is not world:  # a new default group: the old twins went with the old one
        _TWINS.clear()
        _WORLD[0] = world
    return world if group is None else group


def _reduces_on_host(group) -> bool:
    config = str(dist.get_backend_config(group)).lower()
    return "gloo" in config


def host_group(group=None):
    """The group over `group`'s ranks that reduces CPU tensors on the host (Note [Agreements
    on the host]), or None: reduce on the device. A group with one rank needs none."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_world_size(group) <= 1:
        return None
    key = _key(group)
    if key not in _TWINS:
        # Not prepared (a reducer built outside an engine): only a group that reduces CPU
        # tensors itself qualifies; a twin is made only where every member takes part.
        _TWINS[key] = key if _reduces_on_host(group) else None
    return _TWINS[key]


def prepare(group=None, agree_on_device=None) -> Optional[Any]:
    """Called by every member of `group` at the same point (the engine's build): makes an
    NCCL-only group's Gloo twin. `agree_on_device(ok) -> bool` tells whether every member
    made it; the twin is used only then."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) <= 1:
        return None
    key = _key(group)
    if key in _TWINS and (_TWINS[key] is not None or _reduces_on_host(group)):
        return _TWINS[key]
    if _reduces_on_host(group):
        _TWINS[key] = key
        return key
    twin, made = None, True
    try:
        if group is None or group is dist.group.WORLD:
            twin = dist.new_group(backend="gloo")
        else:
            ranks = dist.get_process_group_ranks(group)
            twin = dist.new_group(ranks=ranks, backend="gloo", use_local_synchronization=True)
    except Exception as exc:  # noqa: BLE001 (a network Gloo cannot use: the device path)
        made = False
        logger.warning(
            "zerostream: no Gloo group beside %s (%s): the ranks agree on the device, each "
            "agreement a device-to-host read",
            dist.get_backend(group),
            exc,
        )
    if agree_on_device is not None and not agree_on_device(made):
        made = False
    _TWINS[key] = twin if made else None
    return _TWINS[key]

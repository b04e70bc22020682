"""The collectives of one training step and the links they cross, for N ranks on n nodes of
g GPUs (N = n g), so that `zerostream estimate` can say what a step costs past one machine.

Payloads are counted as the runtime's telemetry counts them (telemetry.py COLLECTIVES): the
whole gathered or reduced tensor of each collective, on every rank; `python -m
zerostream.bench.cluster_check` compares the two on a real multi-node run of this machine.

  stage 3   all_gather      every gather the runtime's prefetch plan makes in a micro-batch
                            (zerostream._C.plan_prefetch over the model's trace: forward, and
                            backward in reverse; persistent params never), each param's shard
                            padded to ceil(numel / N) on every rank, d bytes an element; then
                            once per step the persistent params, re-gathered from their
                            updated shards (zero/stage3/partitioner.py refresh_gathered)
            reduce_scatter  every param's gradient each micro-batch, rank-major with the same
                            padding, in communication_data_type
  stage 1/2 reduce          the gradients once per step (stage 1) or each micro-batch (stage
                            2; a bucket goes as a reduce-scatter or an all-reduce, whichever
                            moves less: counted here as a reduce-scatter of the whole model)
            all_gather      the updated partitions once per step, N ceil(P / N) elements

A ring collective over N ranks sends (N - 1) / N of the payload out of every rank (twice
that for an all-reduce). Rings are laid out node after node, so of each node's g hops g - 1
stay inside the node and one crosses to the next node; NCCL runs several rings, each
leaving a node through another NIC, so per step:

  intra-node link, per GPU     (N - 1) / N x payload x (g - 1) / g   (x 1 on one node)
  network, per node each way   (N - 1) / N x payload                 (0 on one node)

and a collective takes the longer of its two links plus a latency per call of (N - 1) hops
(the ring's steps), each hop the network's latency when the ring crosses nodes.
"""

from __future__ import annotations

import functools
import math
from typing import Dict

from .. import sizing

RING_FACTOR = {"all_gather": 1.0, "reduce_scatter": 1.0, "all_reduce": 2.0}


def _padded(numel: int, world: int) -> int:
    return math.ceil(numel / world) * world


def stage3_homes(shape, knobs, world: int, nvme: bool = False) -> sizing.ShardHomes:
    """Stage 3's home of each of the shape's parameters (sizing.shard_homes: persistent,
    kept in host memory, on disk with `nvme`), in the partitioner's order."""
    _, numels = shape.gather_trace()
    in_cpu = knobs.max_in_cpu if nvme else None
    return sizing.shard_homes(
        numels, world, knobs.persistence_threshold, knobs.model_persistence_threshold, in_cpu
    )


@functools.lru_cache(maxsize=16)
def prefetch_plan(shape, knobs):
    """(plan events, peak live elements, numels, persistent flags) of the runtime's own
    prefetch planner (zero/prefetch_schedule.h) over the model's trace. Cached: an estimate
    asks for it per option from its memory, collective and disk parts (27 runs of the
    planner for a 70B estimate before); shape and knobs are frozen, and no caller changes
    what it returns."""
    from .. import _C

    events, numels = shape.gather_trace()
    persistent = stage3_homes(shape, knobs, 1).persistent
    plan, peak = _C.plan_prefetch(
        events,
        numels,
        persistent,
        knobs.prefetch_bucket_size,
        knobs.max_live_parameters,
        knobs.max_reuse_distance,
    )
    return plan, peak, numels, persistent


def stage3_plan(shape, knobs):
    """(gathered ids per micro-batch, gather calls per micro-batch, numels, persistent
    flags) of the prefetch plan."""
    plan, _, numels, persistent = prefetch_plan(shape, knobs)
    gathered = [p for fetch, prefetch, *_ in plan for p in (*fetch, *prefetch)]
    calls = sum(bool(fetch) + bool(prefetch) for fetch, prefetch, *_ in plan)
    return gathered, calls, numels, persistent


def _buckets(numels, bucket_size: int) -> int:
    """Reduce-scatters of one backward: gradients join the pending bucket as they finish
    (the last parameter first) and it goes out once it holds reduce_bucket_size elements
    or more (zero/stage3/reduce.py), the rest at the end of backward."""
    calls, pending = 0, 0
    for n in reversed(numels):
        pending += n
        if pending >= max(1, bucket_size):
            calls, pending = calls + 1, 0
    return calls + (1 if pending else 0)


def payloads(shape, work, world: int, option, knobs) -> Dict[str, Dict[str, float]]:
    """kind -> {"bytes": per step on each rank, "calls": collectives per step}."""
    d, A, N = work.dtype_bytes, work.grad_accum, world
    comm_d = work.comm_bytes
    if N == 1:
        return {}
    if option.stage == 3:
        gathered, calls, numels, persistent = stage3_plan(shape, knobs)
        gather = sum(_padded(numels[p], N) for p in gathered)
        kept = sum(_padded(n, N) for n, keep in zip(numels, persistent) if keep)
        every = sum(_padded(n, N) for n in numels)
        scale = shape.params / shape.shape_params  # an overridden count scales the shape
        gathers = calls * A + (1 if kept else 0)
        buckets = _buckets(numels, knobs.reduce_bucket_size)
        return {
            "all_gather": {"bytes": d * scale * (A * gather + kept), "calls": gathers},
            "reduce_scatter": {"bytes": comm_d * scale * A * every, "calls": A * buckets},
        }
    P = shape.params
    reductions = 1 if option.stage == 1 else A
    buckets = math.ceil(P / max(1, knobs.reduce_bucket_size))
    pieces = math.ceil(math.ceil(P / N) / max(1, knobs.allgather_bucket_size))
    return {
        "reduce_scatter": {
            "bytes": comm_d * reductions * _padded(P, N),
            "calls": reductions * buckets,
        },
        "all_gather": {"bytes": d * _padded(P, N), "calls": pieces},
    }


def link_bytes(kinds: Dict[str, Dict[str, float]], gpus: int, nodes: int) -> Dict[str, float]:
    """Bytes per step on the intra-node link of each GPU and on each node's network link."""
    N = gpus * nodes
    out = {"intra": 0.0, "net": 0.0}
    for kind, k in kinds.items():
        ring = RING_FACTOR[kind] * (N - 1) / N * k["bytes"]
        out["intra"] += ring * ((gpus - 1) / gpus if nodes > 1 else 1.0)
        out["net"] += ring if nodes > 1 else 0.0
    return out


def link_seconds(kinds: Dict[str, Dict[str, float]], machine) -> Dict[str, float]:
    """Seconds per step each link is busy: its bytes at its rate ("collective" per GPU within
    a node, "net" per node), plus every collective's ring latency on the link its slowest
    hop crosses (the network once there are several nodes)."""
    from .units import GB

    g, n = machine.gpus_per_node, machine.nodes
    N = g * n
    moved = link_bytes(kinds, g, n)
    out = {"intra": moved["intra"] / (machine.rate("collective") * GB)}
    if n > 1:
        out["net"] = moved["net"] / (machine.rate("net") * GB)
    calls = sum(k["calls"] for k in kinds.values())
    slow = "net" if n > 1 else "intra"
    latency = machine.rate("net_latency_us" if n > 1 else "collective_latency_us")
    out[slow] += calls * (N - 1) * latency * 1e-6
    return out


def kind_seconds(kind: str, k: Dict[str, float], machine) -> float:
    """One kind's seconds per step: the busier of its links (a ring runs at its slowest)."""
    return max(link_seconds({kind: k}, machine).values())

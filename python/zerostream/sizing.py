"""The sizes the runtime allocates, as plain arithmetic over ints and dtype names, so that
the runtime (zero/, offload/), the estimator (estimate/) and the benches (bench/) compute
each one the same way. Torch-free and importing nothing of zerostream: the estimator runs
without torch's import cost, and offload/ (which may not import zero/) and zero/ both
stand on it.

Note [One formula per allocated size]
  Each quantity here was once computed in several places (the stage that allocates it, the
  planner that predicts it, a bench that budgets for it), and the copies drifted: the
  planner's offloaded gradients ignored zerostream.offload_gradient_dtype and
  grad_accum_dtype, its persistent params ignored model_persistence_threshold, the
  capacity bench had no 10-byte optimizer state. The runtime now calls these functions where
  it sizes an allocation, and tests/python/estimate/test_estimate_vs_runtime.py checks the
  planner's terms against what small real engines allocate, term by term.

Dtypes are named as the config names them: "fp32", "bf16", "fp16".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, List, Optional

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
HALF = ("bf16", "fp16")  # the 16-bit dtypes a CPU kernel reads gradients in (COPY_DTYPES)
PAGE = 4096  # a HostArena's allocation unit (offload/host_arena.cpp)


def arena_bytes(nbytes: int) -> int:
    """What a request of `nbytes` takes from a HostArena budget: whole 4 KiB pages, at least
    one (offload/host_arena.cpp)."""
    return max(PAGE, (int(nbytes) + PAGE - 1) // PAGE * PAGE)


# --- optimizer state (Note [16-bit master weights with an offloaded optimizer]) ---------------


def master_bytes(bf16_master: bool) -> int:
    """Bytes an element of the master weights: bf16.bf16_master_weights_and_grads keeps
    them in bf16."""
    return 2 if bf16_master else 4


def moment_bytes(bf16_states: bool) -> int:
    """Bytes an element of one optimizer moment: bf16 under bf16.bf16_optimizer_states."""
    return 2 if bf16_states else 4


def optimizer_state_bytes(bf16_master: bool, bf16_states: bool, states: int = 2) -> int:
    """Master and `states` moments (Adam: 2) per element: 12 (fp32 master and moments), 10
    (bf16 master, fp32 moments) or 6 (bf16 master and moments)."""
    return master_bytes(bf16_master) + states * moment_bytes(bf16_states)


def widest_state_bytes(bf16_master: bool, bf16_states: bool) -> int:
    """The widest of master and moments per element: what each NVMe staging buffer holds a
    sub-group of (any kind fits, offload/optimizer_swap.py)."""
    return max(master_bytes(bf16_master), moment_bytes(bf16_states))


# --- offloaded gradient partitions (Note [Gradients to an offloaded partition]) ---------------


def offloaded_grad_dtype(
    model_dtype: str,
    accumulation_steps: int,
    offload_gradient_dtype: str = "auto",
    grad_accum_dtype: Optional[str] = None,
    reads_16bit: bool = True,
) -> str:
    """The dtype of an offloaded gradient partition: the model's 16-bit dtype when all five
    hold, so gradients download straight into place; fp32 otherwise.
      - the optimizer's kernel reads 16-bit gradients (`reads_16bit`: zerostream's CPU
        optimizers do; a client's torch optimizer does not)
      - the model is 16-bit
      - nothing accumulates in them (gradient_accumulation_steps 1)
      - zerostream.offload_gradient_dtype is "auto" ("fp32" asks for fp32 always)
      - data_types.grad_accum_dtype is the model's (None: it is), since an extra backward
        before the step adds in that dtype there."""
    if (
        reads_16bit
        and model_dtype in HALF
        and accumulation_steps == 1
        and offload_gradient_dtype == "auto"
        and (grad_accum_dtype or model_dtype) == model_dtype
    ):
        return model_dtype
    return "fp32"


def offloaded_grad_bytes(*args: Any, **kwargs: Any) -> int:
    """Bytes an element of an offloaded gradient partition (offloaded_grad_dtype's)."""
    return DTYPE_BYTES[offloaded_grad_dtype(*args, **kwargs)]


# --- staging buffers ------------------------------------------------------------------------


def device_tier_count(sub_groups: int, ratio: float) -> int:
    """How many of a rank's `sub_groups` (the first, in step order) offload_optimizer.ratio
    keeps on the device: DeepSpeed's int((1 - ratio) * n)."""
    return max(0, min(sub_groups, int((1.0 - float(ratio)) * sub_groups)))


def optimizer_staging_sets(buffer_count: int) -> int:
    """offload_optimizer nvme: the (master, moment, moment) buffer triples the sub-groups
    rotate over, max(2, buffer_count // 3)."""
    return max(2, buffer_count // 3)


def optimizer_staging_bytes(buffer_count: int, sub_group_numel: int, widest: int) -> int:
    """offload_optimizer nvme's staging arena: sets x 3 buffers, each one sub-group (the
    widest on disk) of the widest state kind, in whole arena pages."""
    return optimizer_staging_sets(buffer_count) * 3 * arena_bytes(sub_group_numel * widest)


COPY_SLOT_BYTES = 16 << 20  # the copy stage's largest slot (offload/copy_stage.py)
COPY_SLOTS = 4


def copy_slot_bytes(widest_partition_numel: int) -> int:
    """The copy stage's slot: no larger than the widest fp32 partition (whole pages, at least
    64 KiB), so a small model does not pin the full ring it would never fill."""
    widest = 4 * widest_partition_numel
    return min(COPY_SLOT_BYTES, max(64 << 10, -(-widest // PAGE) * PAGE))


def copy_stage_bytes(slot_bytes: int, slots: int = COPY_SLOTS) -> int:
    """The copy stage's pinned arena: `slots` slots of `slot_bytes` (64-byte aligned)."""
    return slots * arena_bytes(slot_bytes // 64 * 64)


def param_buffer_bytes(buffer_size: int) -> int:
    """One offload_param buffer: buffer_size 16-bit elements, as the arena counts it."""
    return arena_bytes(buffer_size * 2)


def param_staging_budget(buffer_count: int, buffer_size: int, swapped_bytes: int) -> int:
    """offload_param nvme's configured staging, buffer_count x buffer_size, but never more
    than every swapped shard at once (`swapped_bytes`: their sizes in arena pages), since the
    arena is page-locked whole when made."""
    return min(buffer_count * param_buffer_bytes(buffer_size), max(swapped_bytes, 1))


# Stage-3 shard writes in flight at once, each in a buffer of its own as large as the shard
# (Note [Shard writes beside the forward's reads] in zero/stage3/shard_writes.py).
PARAM_WRITES_IN_FLIGHT = 4


def param_staging_need(shard_bytes: int) -> int:
    """What staging must hold for a shard of `shard_bytes` (twice it: one being read while
    the other uploads)."""
    return 2 * arena_bytes(shard_bytes)


def param_staging_bytes(
    largest_shard_bytes: int, buffer_count: int, buffer_size: int, swapped_bytes: int
) -> int:
    """offload_param nvme's staging arena once the reads run: the configured budget, raised
    to hold the largest swapped shard twice (zero/stage3/param_swap.py)."""
    return max(
        param_staging_need(largest_shard_bytes),
        param_staging_budget(buffer_count, buffer_size, swapped_bytes),
    )


def read_ahead_buffer_count(nbytes: int, buffer_size: int) -> int:
    """The buffer_count whose buffers hold `nbytes` of shards read ahead at once."""
    return -(-nbytes // param_buffer_bytes(buffer_size))


# --- stage 3's persistent parameters --------------------------------------------------------


def is_persistent(numel: int, threshold: int, model_threshold: int, persisted: int) -> bool:
    """Whether a parameter of `numel` elements stays gathered on every rank: small enough
    (stage3_param_persistence_threshold) and still within the model's total
    (model_persistence_threshold) with the `persisted` elements already kept."""
    return numel <= threshold and persisted + numel <= model_threshold


def kept_in_cpu(shard_numel: int, in_cpu: int, max_in_cpu: int) -> bool:
    """offload_param nvme: whether a shard stays in host memory, the `in_cpu` elements of
    shards kept before it and this one within max_in_cpu (first come, first kept)."""
    return in_cpu + shard_numel <= max_in_cpu


@dataclass(frozen=True)
class ShardHomes:
    """Where stage 3 puts each parameter, in the order the partitioner sees them."""

    persistent: List[bool]  # gathered on every rank for the whole run
    shards: List[int]  # each parameter's shard, elements (ceil(numel / world))
    in_cpu: List[bool]  # offload_param nvme: the shard kept in host memory (max_in_cpu)
    swapped: List[int]  # the shards on disk, elements

    def swapped_bytes(self, dtype_bytes: int) -> int:
        """The swapped shards as staging holds them (whole arena pages each)."""
        return sum(arena_bytes(n * dtype_bytes) for n in self.swapped)


def shard_homes(
    numels: Iterable[int],
    world: int,
    threshold: int,
    model_threshold: int,
    max_in_cpu: Optional[int] = None,
) -> ShardHomes:
    """Stage 3's homes for parameters of `numels` (partitioner.py): persistent ones keep
    their shard and their gathered tensor; with offload_param nvme (`max_in_cpu` given) the
    others' shards stay in host memory while max_in_cpu allows and go to disk after."""
    persistent, shards, in_cpu, swapped = [], [], [], []
    persisted = kept = 0
    for n in numels:
        keep = is_persistent(n, threshold, model_threshold, persisted)
        persisted += n if keep else 0
        shard = -(-n // max(1, world))
        host = keep or max_in_cpu is None or kept_in_cpu(shard, kept, max_in_cpu)
        if host and not keep and max_in_cpu is not None:
            kept += shard
        persistent.append(keep)
        shards.append(shard)
        in_cpu.append(host and not keep and max_in_cpu is not None)
        if not host:
            swapped.append(shard)
    return ShardHomes(persistent, shards, in_cpu, swapped)

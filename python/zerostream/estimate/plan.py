"""The planner's model of one training step under one ZeRO option: the bytes each memory
holds (per GPU, per host process, per node's NVMe) and the bytes each link moves, from
which it gives a lower bound on the step time.

It models zerostream's runtime as it is built (zero/sharded.py, stage12.py, stage3/,
offload/), each allocation's size by the runtime's own formula (sizing.py, Note [One formula
per allocated size]), so its numbers can be checked against `zerostream bench step`
(benchmarks/estimate.md) and, term by term, against small real engines
(tests/python/estimate/test_estimate_vs_runtime.py):

  per GPU, always there     params (stage 1/2: whole, model dtype; stage 3: this rank's shard
                            plus the small "persistent" params whole); without optimizer
                            offload the fp32 master, fp32 gradient partition, Adam moments
                            (4 + 4 + 8 B per partition element)
  per GPU, forward/backward activations (model.py), the reduce bucket (gradients waiting for
                            their bucket to fill, and the bucket's concatenated copy:
                            2 x reduce_bucket_size elements), stage 3's gathered params (the
                            native prefetch planner's peak over the model's module trace)
  per GPU, optimizer step   torch AdamW's temporaries (sqrt and denominator: 8 B per element
                            on CPU, one 4 B buffer with foreach on CUDA), stage 1/2's
                            all-gather staging when a partition exceeds allgather_bucket_size
  per host process          offload cpu: master + gradient partitions (pinned arena; the
                            gradients 16-bit with a 16-bit model, no accumulation and
                            offload_gradient_dtype and grad_accum_dtype left to the model) and
                            the moments; nvme: the gradient partition and the sub-group
                            staging (sets x 3 buffers of sub_group_size, widest state kind);
                            params offloaded to cpu: the shards (and, without optimizer
                            offload, the optimizer state beside them); to nvme: max_in_cpu of
                            them, the staging arena and the writes' buffers (4 of the
                            largest shard); any offload: the copy stage's pinned
                            staging slots
  per node NVMe             nvme optimizer: fp32 master + moments, 12 B per element (bf16
                            masters, bf16.bf16_master_weights_and_grads: 2 + 8; with
                            bf16_optimizer_states 2 + 4); nvme params: the 16-bit shards
                            beyond max_in_cpu

The peak of a memory is what is always there plus the larger of the two phases' transients.
In backward, stage 3 releases a gathered parameter once its gradient is final, that is once
the gradient sits in the reduce bucket: the two overlap little, so the phase takes the larger
of them on top of the activations (measured: benchmarks/estimate.md).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .. import sizing
from . import links
from .machine import Machine
from .model import ModelShape
from .units import GB, gb

OPTIONS: Tuple[Tuple[int, str, str], ...] = (
    (2, "none", "none"),
    (2, "cpu", "none"),
    (2, "nvme", "none"),
    (3, "none", "none"),
    (3, "cpu", "none"),
    (3, "cpu", "cpu"),
    (3, "nvme", "none"),
    (3, "nvme", "cpu"),
    (3, "nvme", "nvme"),
)
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Option:
    stage: int
    optimizer: str  # offload_optimizer.device
    param: str  # offload_param.device (stage 3)
    # Memory tiers (issue 30): with "nvme", what fits of the optimizer state
    # (zerostream.optimizer_max_in_cpu) and of the param shards (offload_param.max_in_cpu)
    # stays in host memory; the knobs say how much (tiers.plan_tiers).
    tiered: bool = False
    # offload_optimizer.ratio < 1: the first optimizer sub-groups stepped on the GPU (Note
    # [The device tier] in offload/device_tier.py); the knobs' offload_ratio says how many.
    gpu_tier: bool = False

    @property
    def label(self) -> str:
        def where(device: str) -> str:
            return device + ("+host" if self.tiered and device == "nvme" else "")

        optimizer = ("gpu+" if self.gpu_tier else "") + where(self.optimizer)
        text = f"stage {self.stage}, optimizer {optimizer}"
        return text + (f", params {where(self.param)}" if self.stage == 3 else "")

    @property
    def offloads(self) -> int:
        """How much is offloaded, to break ties between equally fast options."""
        rank = {"none": 0, "cpu": 1, "nvme": 2}
        return rank[self.optimizer] + rank[self.param]


@dataclass(frozen=True)
class Workload:
    micro_batch: int
    seq: int
    grad_accum: int
    precision: str  # fp32 | bf16 | fp16
    checkpointing: bool
    # bf16.bf16_master_weights_and_grads / bf16_optimizer_states (zero/master_precision.py)
    bf16_master: bool = False
    bf16_states: bool = False
    comm_precision: Optional[str] = None  # communication_data_type; None: the model's
    offload_grad_dtype: str = "auto"  # zerostream.offload_gradient_dtype
    grad_accum_dtype: Optional[str] = None  # data_types.grad_accum_dtype; None: the model's

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.precision]

    @property
    def comm_bytes(self) -> int:
        """Bytes an element of a gradient reduction (communication_data_type)."""
        return DTYPE_BYTES[self.comm_precision or self.precision]

    @property
    def master_bytes(self) -> int:
        return sizing.master_bytes(self.bf16_master)

    @property
    def moment_bytes(self) -> int:
        """Both Adam moments, per element."""
        return 2 * sizing.moment_bytes(self.bf16_states)

    @property
    def state_bytes(self) -> int:
        """Master and moments per element: 12, 10 or 6."""
        return sizing.optimizer_state_bytes(self.bf16_master, self.bf16_states)

    @property
    def offloaded_grad_bytes(self) -> int:
        """Bytes per element of offloaded gradient partitions (sizing.offloaded_grad_dtype:
        16-bit only when nothing accumulates in them and the config leaves them "auto")."""
        return sizing.offloaded_grad_bytes(
            self.precision, self.grad_accum, self.offload_grad_dtype, self.grad_accum_dtype
        )

    @property
    def state_name(self) -> str:
        """How the memory terms name the optimizer state (master and moments)."""
        master = "bf16 master" if self.bf16_master else "fp32 master"
        return f"{master}, {'bf16 ' if self.bf16_states else ''}Adam m, v"

    @classmethod
    def from_config(
        cls, cfg, micro_batch: int, seq: int, grad_accum: int, checkpointing: bool
    ) -> "Workload":
        """The workload a resolved config trains, its precision fields its own
        (config_precision)."""
        return cls(
            micro_batch, seq, grad_accum, checkpointing=checkpointing, **config_precision(cfg)
        )

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one GPU."""
        return self.micro_batch * self.seq


def config_precision(cfg) -> dict:
    """The Workload fields a resolved config (zerostream.config) sets: the precision, the
    16-bit masters and moments (zero/master_precision.py: bf16_optimizer_states, or the
    optimizer's fp32_optimizer_states false), where offloaded gradients land
    (zerostream.offload_gradient_dtype) and where micro-steps accumulate
    (data_types.grad_accum_dtype)."""
    from ..config import dtype_name

    master = bool(cfg.bf16.enabled and cfg.bf16.bf16_master_weights_and_grads)
    params = cfg.optimizer.params if cfg.optimizer is not None else {}
    fp32_states = params.get("fp32_optimizer_states", True) is not False
    return dict(
        precision=cfg.precision,
        bf16_master=master,
        bf16_states=master and (bool(cfg.bf16.bf16_optimizer_states) or not fp32_states),
        offload_grad_dtype=cfg.zerostream.offload_gradient_dtype,
        grad_accum_dtype=dtype_name(cfg.data_types.grad_accum_dtype),
    )


@dataclass(frozen=True)
class Knobs:
    """The ZeRO settings a prediction assumes, in elements (ds_config keys' units)."""

    reduce_bucket_size: int
    allgather_bucket_size: int
    prefetch_bucket_size: int
    max_live_parameters: int
    max_reuse_distance: int
    persistence_threshold: int
    sub_group_size: int
    optimizer_buffer_count: int
    param_buffer_count: int
    param_buffer_size: int
    max_in_cpu: int
    optimizer_max_in_cpu: int = 0  # zerostream.optimizer_max_in_cpu, elements per rank
    # offload_optimizer.ratio (stage 3): the share of the sub-groups offloaded; the rest
    # are stepped on the device (Note [The device tier] in offload/device_tier.py).
    offload_ratio: float = 1.0
    # zerostream.device_tier_grads: where the device tier's gradients land ("device", as in
    # DeepSpeed, or "host" and back up: Note [Device-tier gradients stay on the device])
    device_tier_grads: str = "device"
    # zerostream.optimizer_max_on_device as elements (stages 1-3): the first whole sub-groups
    # within it are the device tier instead of a ratio's ("auto" is the run's to size).
    optimizer_max_on_device: int = 0
    # stage3_model_persistence_threshold: the persistent params' total (partitioner.py)
    model_persistence_threshold: int = 2**63 - 1
    # zerostream.overlap_step "backward": the most host bytes its copies of speculatively
    # updated pieces take (zerostream.speculative_step_bytes; zero/speculate.py), else 0
    speculative_bytes: int = 0

    @classmethod
    def from_config(cls, cfg) -> "Knobs":
        """The knobs of a resolved config: its zero_optimization section and zerostream's
        tier settings (knobs_from_config)."""
        ext = cfg.zerostream
        knobs = knobs_from_config(
            cfg.zero_optimization,
            ext.optimizer_max_in_cpu,
            ext.device_tier_grads,
            ext.optimizer_max_on_device,
        )
        if ext.overlap_step == "backward":
            knobs = dataclasses.replace(knobs, speculative_bytes=ext.speculative_step_bytes)
        return knobs


def auto_knobs(shape: ModelShape, option: Option) -> Knobs:
    """What the written config sets: the bucket sizes DeepSpeed's Hugging Face integration
    derives from the hidden size ("auto": h^2, 0.9 h^2, 10 h), DeepSpeed's defaults for the
    stage-3 caps, sub-groups of 1e8 elements with NVMe (2 sets x 3 fp32 buffers = 2.4 GB of
    staging per process), and every offloaded param shard on disk (max_in_cpu 0)."""
    h = shape.hidden
    largest = max(max(p) for _, p in shape.modules())
    return Knobs(
        reduce_bucket_size=h * h,
        allgather_bucket_size=int(5e8),
        prefetch_bucket_size=int(0.9 * h * h),
        max_live_parameters=int(1e9),
        max_reuse_distance=int(1e9),
        persistence_threshold=10 * h,
        sub_group_size=int(1e8) if option.optimizer == "nvme" else int(1e9),
        optimizer_buffer_count=4,
        param_buffer_count=5,
        param_buffer_size=max(int(1e8), largest),
        max_in_cpu=0,
    )


def knobs_from_config(zero, in_cpu=0, tier_grads: str = "device", on_device=0) -> Knobs:
    """The knobs of a resolved config's zero_optimization section (zerostream.config) and
    its zerostream.optimizer_max_in_cpu (`in_cpu`; "auto" is planned by the run),
    zerostream.device_tier_grads (`tier_grads`) and zerostream.optimizer_max_on_device
    (`on_device`; "auto" is sized by the run from its device memory: counted as none, the
    bound on host memory and disk the preflight must pass)."""
    op, oo = zero.offload_param, zero.offload_optimizer
    return Knobs(
        reduce_bucket_size=zero.reduce_bucket_size,
        allgather_bucket_size=zero.allgather_bucket_size,
        prefetch_bucket_size=zero.stage3_prefetch_bucket_size,
        max_live_parameters=zero.stage3_max_live_parameters,
        max_reuse_distance=zero.stage3_max_reuse_distance,
        persistence_threshold=zero.stage3_param_persistence_threshold,
        sub_group_size=zero.sub_group_size,
        optimizer_buffer_count=oo.buffer_count if oo else 4,
        param_buffer_count=op.buffer_count if op else 5,
        param_buffer_size=op.buffer_size if op else int(1e8),
        # "auto" is decided by the run from its free memory after the first step: the
        # estimate counts every shard on disk, the bound the preflight must pass.
        max_in_cpu=(0 if op.max_in_cpu == "auto" else op.max_in_cpu) if op else int(1e9),
        optimizer_max_in_cpu=0 if in_cpu == "auto" else in_cpu,
        offload_ratio=oo.ratio if oo and zero.stage == 3 else 1.0,
        device_tier_grads=tier_grads,
        optimizer_max_on_device=0 if on_device == "auto" or zero.stage == 0 else on_device,
        model_persistence_threshold=zero.stage3_model_persistence_threshold,
    )


def device_tier_elements(part: int, option: "Option", knobs: Knobs) -> int:
    """Elements of a rank's partition whose optimizer state offload_optimizer.ratio keeps on
    the device: the first int((1 - ratio) * n) of its n sub-groups (device_tier.py), or the
    whole ones within zerostream.optimizer_max_on_device (offload/placement/device.py), the
    sub-groups taken as sub_group_size each (the runtime also cuts at param groups)."""
    if option.stage == 0 or option.optimizer == "none":
        return 0
    width = min(knobs.sub_group_size or part, part) or 1
    if knobs.optimizer_max_on_device > 0:  # whole sub-groups within the count
        return min(part, knobs.optimizer_max_on_device // width * width)
    if knobs.offload_ratio >= 1.0:
        return 0
    return min(part, sizing.device_tier_count(math.ceil(part / width), knobs.offload_ratio) * width)


@dataclass
class Prediction:
    option: Option
    knobs: Knobs
    device: Dict[str, int]  # per GPU (CPU-only: per process), always there
    backward: Dict[str, int]  # per GPU, while forward and backward run
    step: Dict[str, int]  # per GPU, during the optimizer step
    host: Dict[str, int]  # per process
    host_startup: int  # per node, while the model is built and placed
    nvme: Dict[str, int]  # per process
    traffic: Dict[str, float]  # bytes (cpu_adam: params) per step, per GPU or per node
    seconds: Dict[str, float]
    machine: Machine
    problems: List[str] = field(default_factory=list)

    @property
    def backward_peak(self) -> int:
        """The forward/backward transients at their peak (see the module doc)."""
        b = dict(self.backward)
        overlap = max(b.pop("gathered params", 0), b.pop("reduce bucket", 0))
        return sum(b.values()) + overlap

    @property
    def device_peak(self) -> int:
        return sum(self.device.values()) + max(self.backward_peak, sum(self.step.values()))

    @property
    def process_rss(self) -> int:
        """Peak resident host memory of one training process (CPU-only: everything)."""
        own = self.machine.host_overhead + sum(self.host.values())
        return own + (self.device_peak if self.machine.cpu_only else 0)

    @property
    def host_node(self) -> int:
        steady = self.machine.gpus_per_node * self.process_rss
        return max(steady, self.host_startup)

    @property
    def nvme_node(self) -> int:
        return self.machine.gpus_per_node * sum(self.nvme.values())

    @property
    def step_seconds(self) -> float:
        return max(self.seconds.values())

    @property
    def bound_by(self) -> str:
        return max(self.seconds, key=self.seconds.get)

    @property
    def fits(self) -> bool:
        return not self.problems


def _gathered_elements(shape: ModelShape, knobs: Knobs) -> Tuple[int, int]:
    """(peak gathered non-persistent elements, persistent elements) of stage 3, from the
    runtime's own prefetch planner run over the model's trace (links.prefetch_plan)."""
    _, peak, numels, persistent = links.prefetch_plan(shape, knobs)
    scale = shape.params / shape.shape_params  # an overridden count scales the shape
    return int(peak * scale), int(sum(n for n, p in zip(numels, persistent) if p) * scale)


def _shard_reads(shape: ModelShape, knobs: Knobs) -> float:
    """How many times a micro-batch gathers the non-persistent parameters, on average (the
    NVMe shards are read at each gather): twice when each is released between its forward
    and its backward use, less where stage3_max_reuse_distance and max_live_parameters keep
    it gathered across (the runtime's planner over the model's trace, links.stage3_plan).
    Before 2026-11-29 this was 2 always, twice the reads a small model makes."""
    gathered, _, numels, persistent = links.stage3_plan(shape, knobs)
    total = sum(n for n, p in zip(numels, persistent) if not p)
    read = sum(numels[i] for i in gathered if not persistent[i])
    return read / total if total else 0.0


def _largest_param(shape: ModelShape, world: int) -> int:
    """Elements of the largest parameter's shard."""
    return math.ceil(max(max(p) for _, p in shape.modules()) / world)


def _whole_sub_groups(numel: int, width: int, budget: int) -> int:
    """Elements of whole sub-groups of `numel` cut at `width` (the last one shorter) that
    `budget` elements hold: as many full ones as fit, and the short one if it fits too
    (offload/placement/plans.py place, for one param group)."""
    full, last = divmod(numel, max(1, width))
    kept = min(full, budget // max(1, width)) * width
    return kept + (last if last and kept + last <= budget else 0)


def optimizer_state_key(work: "Workload", in_cpu: bool = False) -> str:
    """The memory term of the NVMe optimizer's state (on disk, or its optimizer_max_in_cpu
    part in host memory)."""
    return work.state_name + (" (optimizer_max_in_cpu)" if in_cpu else "")


def _memory(shape, work, machine, option, knobs):
    """(device, backward, step, host, nvme, startup) byte terms; see the module doc."""
    P, N, d = shape.params, machine.world, work.dtype_bytes
    part = math.ceil(P / N)  # elements of this rank's partition
    dname = "fp32" if d == 4 else "16-bit"
    device: Dict[str, int] = {}
    backward: Dict[str, int] = {}
    step: Dict[str, int] = {}
    host: Dict[str, int] = {}
    nvme: Dict[str, int] = {}
    persistent = 0
    if option.stage == 3:
        gathered, persistent = _gathered_elements(shape, knobs)
        if option.param == "none":
            device[f"{dname} param shard"] = d * part
        device["persistent params"] = d * persistent
        backward["gathered params"] = d * gathered
    else:
        device[f"{dname} params"] = d * P
    master = "bf16 master" if work.bf16_master else "fp32 master"
    moments = "bf16 Adam m, v" if work.bf16_states else "Adam m, v"
    # Without offload the gradient partition has the master's dtype (zero/sharded.py).
    grads_key = "bf16 grads" if work.bf16_master else "fp32 grads"
    states = {master: work.master_bytes * part, grads_key: work.master_bytes * part}
    states[moments] = work.moment_bytes * part
    on_device = device_tier_elements(part, option, knobs)
    # The offloaded gradient partition: without the device tier's share when that lands on
    # the device (Note [Device-tier gradients stay on the device]).
    landed = part - on_device if knobs.device_tier_grads == "device" else part
    host_grads = ("16-bit grads", 2 * landed) if work.offloaded_grad_bytes == 2 else None
    if on_device:  # offload_optimizer.ratio: the device tier's state, the rest offloaded
        device[f"device-tier {master}"] = work.master_bytes * on_device
        device[f"device-tier {moments}"] = work.moment_bytes * on_device
        # Its gradients land on the device, in the host partition's dtype, and the host
        # partition holds only the rest. With device_tier_grads "host" they land on the
        # host and one sub-group's slice at a time goes back up instead.
        if knobs.device_tier_grads == "device":
            device["device-tier grads"] = work.offloaded_grad_bytes * on_device
        else:
            width = min(knobs.sub_group_size or part, part)
            step["device-tier gradient buffer"] = work.offloaded_grad_bytes * width
        states[master] = work.master_bytes * (part - on_device)
        states[moments] = work.moment_bytes * (part - on_device)
    if option.optimizer == "none":
        # Offloaded params put the state beside them in host memory (zero/sharded.py).
        home = host if option.stage == 3 and option.param != "none" else device
        home.update(states)
        step["AdamW temporaries"] = (8 if machine.cpu_only else 4) * part
    elif option.optimizer == "cpu":
        host.update(states)
        del host[grads_key]
        name, size = host_grads or ("fp32 grads", 4 * landed)
        host[name] = size
        if knobs.speculative_bytes:  # at most a copy of the whole master and moments
            whole = states[master] + states[moments]
            host["speculation copies"] = min(knobs.speculative_bytes, whole)
    else:
        # Sub-groups of sub_group_size (0: one per parameter, at most the largest), whole ones
        # within optimizer_max_in_cpu kept in host memory.
        width = min(knobs.sub_group_size or _largest_param(shape, N), part)
        name, size = host_grads or ("fp32 grads", 4 * landed)
        host[name] = size
        widest = sizing.widest_state_bytes(work.bf16_master, work.bf16_states)
        in_host = _whole_sub_groups(part - on_device, width, knobs.optimizer_max_in_cpu)
        on_disk = min(width, part - on_device - in_host) or 1
        host["optimizer staging"] = sizing.optimizer_staging_bytes(
            knobs.optimizer_buffer_count, on_disk, widest
        )
        if in_host:
            host[optimizer_state_key(work, in_cpu=True)] = work.state_bytes * in_host
        nvme[optimizer_state_key(work)] = work.state_bytes * (part - on_device - in_host)
    if option.optimizer != "none" or (option.stage == 3 and option.param != "none"):
        host["copy stage staging"] = sizing.copy_stage_bytes(sizing.copy_slot_bytes(part))
    if option.stage == 3 and option.param != "none":
        shard = d * (part - math.ceil(persistent / N))
        if option.param == "cpu":
            host[f"{dname} param shards"] = shard
        else:
            homes = links.stage3_homes(shape, knobs, N, nvme=True)
            scale = shape.params / shape.shape_params  # an overridden count scales the shape
            swapped = int(d * sum(homes.swapped) * scale)
            if shard > swapped:
                host[f"{dname} param shards (max_in_cpu)"] = shard - swapped
            # The staging arena is made once a shard goes to disk (zero/stage3/param_swap.py).
            host["param staging"] = (
                sizing.param_staging_bytes(
                    d * max(homes.swapped),
                    knobs.param_buffer_count,
                    knobs.param_buffer_size,
                    int(homes.swapped_bytes(d) * scale),
                )
                if homes.swapped
                else 0
            )
            # Writes go through buffers of their own, WRITES_IN_FLIGHT of the largest shard
            # (Note [Shard writes beside the forward's reads] in zero/stage3/shard_writes.py).
            host["param write buffers"] = (
                sizing.PARAM_WRITES_IN_FLIGHT * d * max(homes.swapped) if homes.swapped else 0
            )
            nvme[f"{dname} param shards"] = swapped
    act = shape.activation_bytes(work.tokens, d, work.checkpointing)
    backward["activations"] = act["layers"]
    backward["layer backward"] = act["layer_backward"]
    backward["logits/loss"] = act["head"]
    if option.stage == 1:  # gradients accumulate whole, reduced once per step
        device[f"{dname} gradient accumulator"] = d * P
    else:
        backward["reduce bucket"] = 2 * d * min(knobs.reduce_bucket_size, P)
    if option.stage < 3 and N > 1 and part > knobs.allgather_bucket_size:
        step["all-gather staging"] = d * N * knobs.allgather_bucket_size
    # Stage 1/2 (and stage 3 without zero.Init) build the whole model in every process first.
    startup = machine.gpus_per_node * (d * P + machine.host_overhead) if option.stage < 3 else 0
    return device, backward, step, host, nvme, startup


def _traffic(shape, work, machine, option, knobs, nvme) -> Dict[str, float]:
    """Bytes per optimizer step (grad_accum micro-batches): pcie per GPU each way, nvme per
    node, collective per GPU; cpu_adam is parameters per node; flops per GPU."""
    P, N, d, A = shape.params, machine.world, work.dtype_bytes, work.grad_accum
    g = machine.gpus_per_node
    part = math.ceil(P / N)
    t = {"h2d": 0.0, "d2h": 0.0, "nvme_read": 0.0, "nvme_write": 0.0}
    on_device = device_tier_elements(part, option, knobs)
    if option.optimizer != "none":
        # Gradient partitions to the host every micro-batch, but the device tier's, which
        # land on the device (offload_optimizer.ratio), unless device_tier_grads is "host":
        # then they come back up for its update
        grads_home = on_device if knobs.device_tier_grads == "device" else 0
        t["d2h"] += d * (part - grads_home) * A
        t["h2d"] += work.offloaded_grad_bytes * (on_device - grads_home)
        if option.param == "none":
            t["h2d"] += d * (part - on_device)  # the updated 16-bit partition back
        else:  # the device tier's updated weights down to the host shards
            t["d2h"] += d * on_device
    if option.stage == 3 and option.param != "none":
        t["h2d"] += 2 * d * part * A  # shards up for the forward and the backward gathers
    if option.optimizer == "nvme":  # master and moments, each sub-group in and out
        on_disk = nvme.get(optimizer_state_key(work), 0)
        t["optimizer_nvme_read"] = t["optimizer_nvme_write"] = g * float(on_disk)
    disk_shard = nvme.get(f"{'fp32' if d == 4 else '16-bit'} param shards", 0)
    if disk_shard:  # shards read for the gathers the prefetch plan makes, written after
        t["param_nvme_read"] = g * _shard_reads(shape, knobs) * disk_shard * A
        t["param_nvme_write"] = g * float(disk_shard)
    for way in ("read", "write"):
        t[f"nvme_{way}"] = t.get(f"optimizer_nvme_{way}", 0.0) + t.get(f"param_nvme_{way}", 0.0)
    kinds = links.payloads(shape, work, N, option, knobs)
    for kind, k in kinds.items():  # the payloads the telemetry counts, and their calls
        t[kind] = k["bytes"]
        t[f"{kind}_calls"] = k["calls"]
    for link, moved in links.link_bytes(kinds, g, machine.nodes).items():
        t[link] = moved
    on_cpu = part - on_device if option.optimizer != "none" else part
    t["cpu_adam"] = float(g * on_cpu) if (option.optimizer != "none" or machine.cpu_only) else 0.0
    t["flops"] = (8 if work.checkpointing else 6) * P * work.tokens * A
    return t


def _seconds(t: Dict[str, float], machine: Machine) -> Dict[str, float]:
    r = machine.rate
    s = {
        "compute": t["flops"] / (r("peak_tflops") * 1e12),
        "nvme": t["nvme_read"] / (r("nvme_read") * GB) + t["nvme_write"] / (r("nvme_write") * GB),
        "cpu_adam": t["cpu_adam"] / (r("cpu_adam") * 1e9),
    }
    kinds = {
        kind: {"bytes": t[kind], "calls": t[f"{kind}_calls"]}
        for kind in links.RING_FACTOR
        if kind in t
    }
    s.update(links.link_seconds(kinds, machine) if kinds else {"intra": 0.0})
    if not machine.cpu_only:
        s["pcie"] = max(t["h2d"], t["d2h"]) / (r("pcie") * GB)
    return s


def _largest(terms: Dict[str, int]) -> str:
    name = max(terms, key=terms.get)
    return f"{name} {gb(terms[name])} GB"


def _problems(p: Prediction) -> List[str]:
    m, out = p.machine, []
    if not m.cpu_only and p.device_peak + m.gpu_reserve > m.gpu_mem:
        terms = {**p.device, **p.backward}
        out.append(
            f"GPU {gb(p.device_peak + m.gpu_reserve)} GB > {gb(m.gpu_mem)} GB "
            f"(largest: {_largest(terms)})"
        )
    if p.host_node > m.host_usable:
        if p.host_startup > m.gpus_per_node * p.process_rss:
            why = "every process builds the whole model first (stage 3 with zero.Init avoids it)"
        else:
            terms = dict(p.host)
            if m.cpu_only:
                terms.update({**p.device, **p.backward})
            why = f"largest per process: {_largest(terms)}" if terms else "process overhead"
        out.append(
            f"host {gb(p.host_node)} GB > {gb(m.host_usable)} GB usable of {gb(m.cpu_mem)} GB "
            f"({why})"
        )
    if p.nvme_node > m.nvme:
        out.append(f"NVMe {gb(p.nvme_node)} GB > {gb(m.nvme)} GB")
    return out


def predict(
    shape: ModelShape,
    work: Workload,
    machine: Machine,
    option: Option,
    knobs: Optional[Knobs] = None,
) -> Prediction:
    if option.stage not in (1, 2, 3):
        raise ValueError(f"zero_optimization.stage: the planner models 1, 2 and 3; got {option}")
    if option.stage < 3 and option.param != "none":
        raise ValueError("offload_param: only stage 3 offloads parameters")
    knobs = knobs or auto_knobs(shape, option)
    device, backward, step, host, nvme, startup = _memory(shape, work, machine, option, knobs)
    traffic = _traffic(shape, work, machine, option, knobs, nvme)
    p = Prediction(
        option=option,
        knobs=knobs,
        device=device,
        backward=backward,
        step=step,
        host=host,
        host_startup=startup,
        nvme=nvme,
        traffic=traffic,
        seconds=_seconds(traffic, machine),
        machine=machine,
    )
    p.problems = _problems(p)
    return p

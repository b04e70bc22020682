"""The typed config: one frozen dataclass per ds_config section, key names as DeepSpeed's
(load.py builds them from the tree the native core resolved). Each component takes its own
section object; nothing downstream reads raw dicts or re-applies defaults."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple, Union


@dataclass(frozen=True)
class OffloadOptimizerConfig:
    device: str
    nvme_path: Optional[str]
    buffer_count: int
    pin_memory: bool
    pipeline_read: bool
    pipeline_write: bool
    pipeline: bool
    fast_init: bool
    ratio: float
    super_offload: bool
    cpuadam_cores_perc: float


@dataclass(frozen=True)
class OffloadParamConfig:
    device: str
    nvme_path: Optional[str]
    buffer_count: int
    buffer_size: int
    max_in_cpu: Union[int, str]  # "auto": the most-read shards that fit (offload/placement/)
    pin_memory: bool


@dataclass(frozen=True)
class ZeroConfig:
    stage: int
    contiguous_gradients: bool
    overlap_comm: bool
    reduce_scatter: bool
    reduce_bucket_size: int
    use_multi_rank_bucket_allreduce: bool
    allgather_partitions: bool
    allgather_bucket_size: int
    round_robin_gradients: bool
    load_from_fp32_weights: bool
    elastic_checkpoint: bool
    parameter_alignment: bool
    offload_optimizer: Optional[OffloadOptimizerConfig]
    offload_param: Optional[OffloadParamConfig]
    sub_group_size: (
        int  # elements per optimizer sub-group; 0: one per parameter (zero/sub_groups.h)
    )
    stage3_prefetch_bucket_size: int
    stage3_param_persistence_threshold: int
    stage3_model_persistence_threshold: int
    stage3_max_live_parameters: int
    stage3_max_reuse_distance: int
    stage3_gather_16bit_weights_on_model_save: bool
    stage3_module_granularity_threshold: int
    stage3_use_all_reduce_for_fetch_params: bool
    stage3_allgather_sequential: bool
    ignore_unused_parameters: bool
    legacy_stage1: bool
    zero_hpz_partition_size: int
    zero_quantized_weights: bool
    zero_quantized_nontrainable_weights: bool
    zero_quantized_gradients: bool
    zeropp_loco_param: Any
    mics_shard_size: int
    mics_hierarchical_params_gather: bool
    memory_efficient_linear: bool
    pipeline_loading_checkpoint: bool
    override_module_apply: bool
    log_trace_cache_warnings: bool
    enable_sanity_checks: bool
    save_muon_momentum_buffer_in_memory: bool
    zenflow: Any  # a ZenFlowConfig or None once loaded (config/zenflow.py)
    leaf_module: Any

    @property
    def offload_optimizer_device(self) -> str:
        return self.offload_optimizer.device if self.offload_optimizer else "none"

    @property
    def offload_param_device(self) -> str:
        # DeepSpeed (and zerostream) use offload_param at stage 3 only.
        if self.stage != 3 or self.offload_param is None:
            return "none"
        return self.offload_param.device


@dataclass(frozen=True)
class FP16Config:
    enabled: bool
    auto_cast: bool
    loss_scale: float
    initial_scale_power: int
    loss_scale_window: int
    hysteresis: int
    consecutive_hysteresis: bool
    min_loss_scale: int
    fp16_master_weights_and_grads: bool

    @property
    def dynamic_loss_scale(self) -> bool:
        return self.loss_scale == 0


@dataclass(frozen=True)
class BF16Config:
    enabled: bool
    immediate_grad_update: bool
    check_grad_overflow: bool
    bf16_master_weights_and_grads: bool
    bf16_optimizer_states: bool


@dataclass(frozen=True)
class OptimizerConfig:
    """`optimizer`: for DeepSpeed's own types (Adam, AdamW, Adagrad, Lion, SGD) `params` holds
    every keyword of the type's schema, defaults filled; torch.optim classes pass through."""

    type: str
    params: Mapping[str, Any]
    legacy_fusion: bool

    @property
    def name(self) -> str:
        """The type, lowercased (DeepSpeed matches optimizer names case-insensitively)."""
        return self.type.lower()

    def kwargs(self, *keys: str) -> dict:
        """The named constructor keywords from the resolved params (for DeepSpeed's own types
        the schema filled every one); `betas` as a tuple, as torch expects."""
        return {k: tuple(self.params[k]) if k == "betas" else self.params[k] for k in keys}

    @property
    def adamw_mode(self) -> bool:
        """DeepSpeed's rule: "AdamW" is decoupled weight decay; "Adam" is too unless
        params.adam_w_mode is false (reference §1.5)."""
        if self.name not in ("adam", "adamw"):
            raise ValueError(f"optimizer.type: {self.type!r} is not Adam or AdamW")
        return self.name == "adamw" or bool(self.params["adam_w_mode"])


@dataclass(frozen=True)
class SchedulerConfig:
    type: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class AioConfig:
    block_size: int
    queue_depth: int
    intra_op_parallelism: int
    single_submit: bool
    overlap_events: bool
    use_gds: bool
    backend: str  # zerostream extension: "auto" | "io_uring" | "threads"


@dataclass(frozen=True)
class ActivationCheckpointingConfig:
    partition_activations: bool
    cpu_checkpointing: bool
    contiguous_memory_optimization: bool
    number_checkpoints: Optional[int]
    synchronize_checkpoint_boundary: bool
    profile: bool


# The dtype names data_types accepts (DeepSpeed's DtypeEnum), by what they mean.
_DTYPE_NAMES = {
    "fp32": ("fp32", "float32", "float", "torch.float32"),
    "fp16": ("fp16", "float16", "half", "torch.float16"),
    "bf16": ("bf16", "bfloat16", "torch.bfloat16"),
}


def dtype_name(name: Optional[str]) -> Optional[str]:
    """'fp32', 'fp16' or 'bf16' for any of DeepSpeed's spellings; None stays None."""
    if name is None:
        return None
    for short, spellings in _DTYPE_NAMES.items():
        if name in spellings:
            return short
    raise ValueError(f"data_types: unknown dtype {name!r}")


@dataclass(frozen=True)
class DataTypesConfig:
    grad_accum_dtype: Optional[str]
    param_dtype: Optional[str]  # must match fp16/bf16 (checked by the config rules)
    buffer_dtype: Optional[str]  # floating buffers cast to it; None: they keep theirs

    @property
    def buffer(self) -> Optional[str]:
        return dtype_name(self.buffer_dtype)


@dataclass(frozen=True)
class ThroughputTimerConfig:
    """`timers.throughput` (profiling/throughput.py)."""

    enabled: bool
    synchronized: bool


@dataclass(frozen=True)
class TimersConfig:
    throughput: ThroughputTimerConfig


@dataclass(frozen=True)
class ParallelWriteConfig:
    pipeline_stage: bool


@dataclass(frozen=True)
class CheckpointConfig:
    tag_validation: str
    load_universal: bool
    use_node_local_storage: bool
    parallel_write: ParallelWriteConfig
    checkpoint_serialization: bool
    writer: Any


@dataclass(frozen=True)
class MonitorConfig:
    enabled: bool
    output_path: str
    job_name: str


@dataclass(frozen=True)
class WandbConfig:
    enabled: bool
    group: Optional[str]
    team: Optional[str]
    project: str


@dataclass(frozen=True)
class CometConfig:
    enabled: bool
    samples_log_interval: int
    project: Optional[str]
    workspace: Optional[str]
    api_key: Optional[str]
    experiment_name: Optional[str]
    experiment_key: Optional[str]
    online: Optional[bool]
    mode: Optional[str]


@dataclass(frozen=True)
class MonitorConfigs:
    """The four writer sections together, as DeepSpeed's `config.monitor_config` groups them
    (zerostream/monitor/ reads them)."""

    tensorboard: MonitorConfig
    csv_monitor: MonitorConfig
    wandb: WandbConfig
    comet: CometConfig

    @property
    def enabled(self) -> bool:
        return any(s.enabled for s in (self.tensorboard, self.csv_monitor, self.wandb, self.comet))


@dataclass(frozen=True)
class CommsLoggerConfig:
    """`comms_logger` (comm/comms_logging.py): which collectives are timed and how they
    print."""

    enabled: bool
    prof_all: bool
    prof_ops: list  # op names or DeepSpeed log_names, checked strings by the config rules
    verbose: bool
    debug: bool


@dataclass(frozen=True)
class FlopsProfilerConfig:
    """`flops_profiler` (engine/profiling.py): which global step's forward rank 0 profiles,
    and how the profile prints."""

    enabled: bool
    recompute_fwd_factor: float
    profile_step: int
    module_depth: int
    top_modules: int
    detailed: bool
    output_file: Optional[str]


@dataclass(frozen=True)
class ZeroStreamExtConfig:
    verify_swap_checksums: bool
    cpu_optimizer_threads: int  # 0: the default of zerostream/ops/threads.py
    # A run whose steps are all skipped (inf/NaN gradients) this many times in a row stops
    # with an error instead of "training" on; 0 never stops.
    max_consecutive_skipped_steps: int
    # Offloaded gradient partitions: "auto" keeps them 16-bit where nothing accumulates in
    # them (Note [Gradients to an offloaded partition], zero/grad_reduce.py); "fp32" always.
    offload_gradient_dtype: str
    # offload_optimizer nvme: optimizer-state elements per rank kept in host memory (whole
    # sub-groups, never written to the swap files), or "auto": as many as the free host
    # memory allows (offload/placement/). 0: all on NVMe, DeepSpeed's behaviour.
    optimizer_max_in_cpu: Union[int, str]
    # ZeRO-3 with offload_optimizer cpu or nvme: optimizer-state elements per rank kept and
    # stepped on the compute device (whole sub-groups, the first in step order, as
    # offload_optimizer.ratio places them), or "auto": as many as the device memory a
    # measured step leaves allows (offload/placement/device.py). 0: none, DeepSpeed's default.
    optimizer_max_on_device: Union[int, str]
    # offload_optimizer.ratio's device sub-groups: their gradients land on the device
    # ("device", DeepSpeed's behaviour) or cross to the host partition and back up for their
    # update ("host": 2-4 bytes an element less device memory, so more sub-groups fit there;
    # Note [Device-tier gradients stay on the device] in offload/device_tier.py).
    device_tier_grads: str
    # "retain": freed host memory stays in the process for the next step (no fresh pages to
    # fault in on the CPU path; Note [Fresh pages cost more than the math] in host_malloc.py);
    # "system": glibc's own policy.
    host_malloc: str
    # "next_forward": ZeRO-3 with offload_optimizer cpu runs the optimizer update on a thread
    # of its own while the next forward gathers the shards it has updated (Note [The step
    # overlapped with the next forward] in zero/overlap.py); "backward": the update starts
    # during the backward on the pieces whose gradients are final, speculatively (Note [The
    # step started during the backward] in zero/speculate.py), at stage 3 then behind the
    # next forward as "next_forward", at stage 2 finished by step();
    # "none": step() returns updated.
    overlap_step: str
    # overlap_step "backward": host bytes the pre-update copies of the speculatively updated
    # pieces may take (restored when the clip factor or an overflow proves them wrong);
    # pieces past it wait for step().
    speculative_step_bytes: int


@dataclass(frozen=True)
class DeepSpeedConfig:
    """The resolved config. Section objects mirror ds_config's sections and key names."""

    train_batch_size: Optional[int]
    train_micro_batch_size_per_gpu: Optional[int]
    gradient_accumulation_steps: Optional[int]
    gradient_clipping: float
    steps_per_print: Optional[int]
    wall_clock_breakdown: bool
    memory_breakdown: bool
    dump_state: bool
    prescale_gradients: bool
    gradient_predivide_factor: float
    gradient_allreduce_op: str
    communication_data_type: str
    zero_allow_untested_optimizer: bool
    zero_force_ds_cpu_optimizer: bool
    sparse_gradients: bool
    disable_allgather: bool
    dataloader_drop_last: bool
    managed_gradient_accumulation: bool
    vocabulary_size: Optional[int]
    log_level: Optional[str]
    sequence_parallel_size: int
    allgather_size: int
    use_data_before_expert_parallelism: bool
    graph_harvesting: bool
    zero_optimization: ZeroConfig
    fp16: FP16Config
    bf16: BF16Config
    optimizer: Optional[OptimizerConfig]
    scheduler: Optional[SchedulerConfig]
    aio: AioConfig
    activation_checkpointing: ActivationCheckpointingConfig
    data_types: DataTypesConfig
    checkpoint: CheckpointConfig
    tensorboard: MonitorConfig
    csv_monitor: MonitorConfig
    wandb: WandbConfig
    comet: CometConfig
    comms_logger: CommsLoggerConfig
    timers: TimersConfig
    flops_profiler: FlopsProfilerConfig
    zerostream: ZeroStreamExtConfig
    # Read by autocast.plan (Note [torch_autocast] in autocast.py), as given.
    torch_autocast: Optional[Mapping[str, Any]]
    # DeepSpeed features accepted for compatibility but not implemented (a warning says so
    # when one is enabled): kept as given.
    amp: Any
    elasticity: Any
    autotuning: Any
    pipeline: Any
    sparse_attention: Any
    eigenvalue: Any
    progressive_layer_drop: Any
    curriculum_learning: Any
    data_efficiency: Any
    compression_training: Any
    quantize_training: Any
    tensor_parallel: Any
    nebula: Any
    datastates: Any
    hybrid_engine: Any
    compile: Any
    weight_quantization: Any
    # Not from the schema: how the values were settled, and the input itself.
    data_parallel_size: int = 1
    raw: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    resolved: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    warnings: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()

    @property
    def zero_stage(self) -> int:
        return self.zero_optimization.stage

    @property
    def monitor_config(self) -> MonitorConfigs:
        """DeepSpeed's name for the writer sections (`tensorboard`, `csv_monitor`, `wandb`,
        `comet`)."""
        return MonitorConfigs(self.tensorboard, self.csv_monitor, self.wandb, self.comet)

    @property
    def precision(self) -> str:
        return "fp16" if self.fp16.enabled else "bf16" if self.bf16.enabled else "fp32"

    # DeepSpeed's DeepSpeedConfig reads data_types into these two attributes.
    @property
    def param_dtype(self) -> Optional[str]:
        return self.data_types.param_dtype

    @property
    def buffer_dtype(self) -> Optional[str]:
        return self.data_types.buffer_dtype

    # DeepSpeed's DeepSpeedConfig keeps its input dict as `_param_dict`, and reads its
    # eigenvalue_* attributes from quantize_training.eigenvalue (defaults unless
    # quantize_training is enabled; the feature itself, eigenvalue-based MoQ, is disabled
    # there too). Both are read by callers of runtime.config.DeepSpeedConfig.
    @property
    def _param_dict(self) -> Mapping[str, Any]:
        return self.raw

    def __getattr__(self, name: str):
        # Only reached for names the dataclass does not have.
        if name.startswith("eigenvalue_") and name[len("eigenvalue_") :] in EIGENVALUE_DEFAULTS:
            key = name[len("eigenvalue_") :]
            quantize = self.__dict__.get("quantize_training")
            if isinstance(quantize, Mapping) and quantize.get("enabled", False):
                section = quantize.get("eigenvalue")
                if isinstance(section, Mapping):
                    return section.get(key, EIGENVALUE_DEFAULTS[key])
            return EIGENVALUE_DEFAULTS[key]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


# DeepSpeed's eigenvalue settings and their defaults (runtime/constants.py there).
EIGENVALUE_DEFAULTS = {
    "enabled": False,
    "verbose": False,
    "max_iter": 100,
    "tol": 1e-2,
    "stability": 1e-6,
    "gas_boundary_resolution": 1,
    "layer_name": "bert.encoder.layer",
    "layer_num": 0,
}

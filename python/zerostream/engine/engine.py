"""ZeroEngine: DeepSpeed's training loop (forward, backward, step, accumulation, clipping,
precision, schedulers) over the ZeRO optimizer wrappers in zero/."""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from .. import autocast, comm, host_malloc
from ..accelerator import bind_run_device
from ..comm import collective_check
from ..config import DeepSpeedConfig
from ..lr_schedules import build_scheduler
from ..monitor import EngineMonitor
from ..optim_factory import client_groups, muon_groups, param_groups_of
from ..precision import make_loss_scaler
from ..profiling import FlopsProfiler, PhaseTimers, SynchronizedWallClockTimer
from ..telemetry import StepTelemetry
from ..zero.factory import build_zero_optimizer, stage_class
from ..zero.protocol import RunState, StageContext, TrainingState
from ..zero.skips import SkipGuard
from ..zero.state_offload import offload_engine_states, reload_engine_states
from .accessors import Accessors
from .accumulation import GradientAccumulation, NoSyncError
from .checkpoints import EngineCheckpoints
from .profiling import EngineProfiling
from .records import EngineCounters, Ranks, TrainingParts, delegated, field_of, in_phase
from .unsupported import refuse_unsupported

logger = logging.getLogger("zerostream")


def _accessor(name: str):
    """The engine's method `name` (DeepSpeed's): a call on the Accessors it holds."""
    return delegated("_accessors", getattr(Accessors, name))


class ZeroEngine(torch.nn.Module):
    """What `zerostream.initialize` returns. Attributes and methods follow DeepSpeedEngine.

    The engine runs the loop and owns the phase (`training_state`); everything about where
    parameters, gradients and optimizer state live belongs to the stage's ZeRO optimizer
    (zero/protocol.py, Note [Stage seam]). What is not the loop is a collaborator the engine
    holds and hands records to (records.py): the accessors (`_accessors`), the accumulation
    between steps (`_accumulation`) and the checkpoints (`_checkpoints`); the engine's methods
    by DeepSpeed's names call them."""

    # DeepSpeed's counters, ranks, optimizer and LR scheduler as engine attributes, kept in
    # records.py's records.
    global_steps = field_of("_counters", "global_steps", writable=True)
    global_samples = field_of("_counters", "global_samples", writable=True)
    micro_steps = field_of("_counters", "micro_steps", writable=True)
    skipped_steps = field_of("_counters", "skipped_steps", writable=True)
    global_rank = field_of("_ranks", "global_rank")
    world_size = field_of("_ranks", "world_size")
    dp_world_size = field_of("_ranks", "dp_world_size")
    mp_world_size = field_of("_ranks", "mp_world_size")
    local_rank = field_of("_ranks", "local_rank")
    optimizer = field_of("_parts", "optimizer", writable=True)
    lr_scheduler = field_of("_parts", "lr_scheduler", writable=True)
    pipeline_parallelism = field_of("_accumulation", "pipeline_parallelism", writable=True)

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: DeepSpeedConfig,
        optimizer=None,
        model_parameters=None,
        lr_scheduler=None,
        dp_group=None,
    ):
        super().__init__()
        self.module = model
        self._config = cfg
        self.config = dict(cfg.raw)
        self.dp_process_group = dp_group
        self._ranks = Ranks.of(dp_group)
        self._counters = EngineCounters()
        self._parts = TrainingParts()
        self._step_applied = False
        self._parked = None  # what offload_states moved to host memory (zero/state_offload.py)
        self.loss_scaler = make_loss_scaler(cfg.fp16, cfg.zero_optimization.stage)
        self._accessors = Accessors(cfg, self._parts, self.loss_scaler)
        device = self._device()
        self.telemetry = StepTelemetry(issue_timed=device.type == "cuda")
        self._run = RunState()
        # DeepSpeed's engine.timers; they run only with wall_clock_breakdown (profiling.py).
        self.timers = SynchronizedWallClockTimer()
        phase_timers = PhaseTimers(self.timers, enabled=cfg.wall_clock_breakdown)
        ctx = StageContext(
            config=cfg,
            group=dp_group,
            rank=self._ranks.dp_rank,
            world=self.dp_world_size,
            device=device,
            loss_scaler=self.loss_scaler,
            run=self._run,
            telemetry=self.telemetry,
            timers=phase_timers,
        )
        self.device = ctx.device
        groups = muon_groups(optimizer, cfg, model, param_groups_of(model, model_parameters))
        refuse_unsupported(cfg, model, client_groups(optimizer, groups))
        self.monitor = EngineMonitor(cfg.monitor_config)  # rank 0 writes (monitor/)
        # DeepSpeed's engine.flops_profiler (None when the section is off).
        self.flops_profiler = (
            FlopsProfiler(model, self, cfg.flops_profiler.recompute_fwd_factor)
            if cfg.flops_profiler.enabled
            else None
        )
        self._profiling = EngineProfiling(
            cfg, self._counters, self._ranks, self.monitor, phase_timers, self.flops_profiler
        )
        comm.configure(cfg)  # the comms_logger section, when given (comm/comms_logging.py)
        # The stage's class, looked up once: what differs between stages is its attributes
        # and methods (zero/protocol.py), not branches here.
        self._stage = stage_class(cfg.zero_stage)
        self._stage.prepare_module(model, ctx)
        self._accumulation = GradientAccumulation(
            self._accessors, self._stage, self._counters, self._parts, self._run
        )
        self._checkpoints = EngineCheckpoints(
            cfg,
            self.config,
            model,
            self._stage,
            self._ranks,
            self._counters,
            self._parts,
            self._run,
        )
        # Every rank builds its engine here: an NCCL-only group gets its host twin for the
        # step's agreements now, together (Note [Agreements on the host] in comm/).
        comm.prepare_host_group(dp_group)
        self.optimizer = build_zero_optimizer(ctx, groups, client=optimizer, cls=self._stage)
        # torch_autocast (Note [torch_autocast] in autocast.py): fp32 training, forward under
        # torch.autocast; the safe modules' params tagged with their communication dtype.
        self._autocast = autocast.plan(cfg.torch_autocast, cfg.zero_stage)
        if self._autocast is not None:
            autocast.tag_params(model, self._autocast, ctx.device.type)
        self.basic_optimizer = self.optimizer.optimizer if self.optimizer is not None else None
        self.lr_scheduler = self._build_scheduler(lr_scheduler)
        if cfg.log_level is not None:  # DeepSpeed sets its logger (ours, under its name) so
            logger.setLevel(cfg.log_level.upper())
        self._skips = SkipGuard(
            self.optimizer,
            precision=cfg.precision,
            limit=cfg.zerostream.max_consecutive_skipped_steps,
            fp16=cfg.fp16.enabled,
            group=dp_group,
            world=self.dp_world_size,
        )
        # After everything above that can refuse the engine, so that a refusal leaves the
        # process's malloc as it was.
        self._retains_host_memory = cfg.zerostream.host_malloc == "retain"
        if self._retains_host_memory:
            host_malloc.retain()
        if cfg.zero_optimization.round_robin_gradients and self._stage.ignores_round_robin:
            logger.warning(
                "zero_optimization.round_robin_gradients: zerostream partitions "
                "gradients in flat parameter order; the setting has no effect"
            )

    # --- setup ----------------------------------------------------------------------------------
    def _device(self) -> torch.device:
        return bind_run_device(self.local_rank)

    @property
    def training_state(self) -> TrainingState:
        """The phase running now (idle, forward, backward, step); the stage's hooks see it."""
        return self._run.state

    def _build_scheduler(self, client):
        if client is not None:
            if callable(client) and not hasattr(client, "step"):
                return client(self.basic_optimizer)
            return client
        sched = self._config.scheduler
        if sched is None or self.optimizer is None:
            return None
        return build_scheduler(sched.type, self.optimizer, dict(sched.params))

    # --- training loop --------------------------------------------------------------------------
    @property
    def _incomplete_load(self) -> Optional[str]:
        """Set when a load_checkpoint failed after it began to overwrite state
        (checkpoint/load.py); kept in the run state, so the optimizer's own backward refuses
        too."""
        return self._run.inconsistent

    @_incomplete_load.setter
    def _incomplete_load(self, why: Optional[str]) -> None:
        self._run.inconsistent = why

    def _require_consistent(self, what: str) -> None:
        self._run.require_consistent(what)

    def forward(self, *args, **kwargs):
        self._require_consistent("forward")
        if self._config.fp16.enabled and self._config.fp16.auto_cast:

            def cast(x):
                return x.half() if torch.is_tensor(x) and x.is_floating_point() else x

            args = tuple(cast(a) for a in args)
            kwargs = {k: cast(v) for k, v in kwargs.items()}
        with (
            in_phase(self._run, TrainingState.FORWARD),
            self.telemetry.phase("forward"),
            self._profiling.forward(),
        ):
            if self.optimizer is not None:
                self.optimizer.before_forward()
            with autocast.forward_context(self._autocast, self.device.type):
                out = self.module(*args, **kwargs)
            if self.optimizer is not None:
                self.optimizer.after_forward()
            return out

    def torch_autocast_enabled(self) -> bool:
        return self._autocast is not None

    def torch_autocast_dtype(self) -> Optional[torch.dtype]:
        return self._autocast.dtype if self._autocast is not None else None

    def torch_autocast_lower_precision_safe_modules(self) -> list:
        """The safe modules' fully qualified class names (DeepSpeed's accessor)."""
        classes = self._autocast.safe_modules if self._autocast else autocast.DEFAULT_SAFE_MODULES
        return [f"{c.__module__}.{c.__name__}" for c in classes]

    def backward(
        self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True
    ) -> torch.Tensor:
        """Scales the loss (accumulation and fp16 loss scale), runs autograd and starts the
        gradient reductions. Returns loss / gradient_accumulation_steps, as DeepSpeed does."""
        self._parts.require_optimizer("backward")
        self._require_consistent("backward")
        gas = self.gradient_accumulation_steps() if scale_wrt_gas else 1
        # The optimizer runs it in the BACKWARD phase (the one path for optimizer.backward).
        # overlap_step "backward" speculates on the backward that ends the accumulation.
        self.optimizer.boundary_backward = (
            self.is_gradient_accumulation_boundary() and not self._accumulation.in_window
        )
        try:
            with self._profiling.backward():
                self.optimizer.run_backward(loss, self.loss_scaler.loss_scale / gas, retain_graph)
        finally:  # a direct optimizer.backward() later is not armed on a stale answer
            self.optimizer.boundary_backward = False
        self._accumulation.backward_ran()
        self.monitor.backward_seen(loss, gas, self.global_samples)
        return loss.detach() / gas

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` times the fp16 loss scale (1 otherwise), for a caller that runs
        `loss.backward()` itself and then `step()` (DeepSpeed's engine.scale; not divided by
        gradient_accumulation_steps, as there)."""
        self._parts.require_optimizer("scale")
        if not (torch.is_tensor(loss) and loss.numel() == 1 and loss.grad_fn is not None):
            raise AssertionError(
                "scale: loss must be a scalar tensor with grad_fn; for a non-scalar tensor, "
                "call tensor.backward(grad)"
            )
        scale = self.loss_scaler.loss_scale
        return loss * scale if scale != 1 else loss

    def log_level(self):
        """The config's `log_level` (None: the logger's own level stays)."""
        return self._config.log_level

    def step(self, lr_kwargs: Optional[dict] = None) -> None:
        """Applies the optimizer at the accumulation boundary only: reduce, unscale, clip, step,
        and the LR schedule unless the step overflowed (then it is skipped)."""
        self._parts.require_optimizer("step")
        self._require_consistent("step")
        if self._accumulation.in_window:
            raise NoSyncError(
                "step: no step is allowed inside no_sync() (It is illegal to call "
                "Engine.step() inside no_sync context manager)"
            )
        self._accumulation.running_step = True
        try:
            with self._profiling.step(self.is_gradient_accumulation_boundary()):
                self._step(lr_kwargs)
        finally:
            self._accumulation.running_step = False
        self._accumulation.micro_step_ended()

    def _step(self, lr_kwargs: Optional[dict]) -> None:
        boundary = self.is_gradient_accumulation_boundary()
        self._step_applied = False
        if boundary:
            start = time.perf_counter()
            reduce_before = self.telemetry.seconds["reduce"]
            with in_phase(self._run, TrainingState.STEP):
                applied = self.optimizer.step()
            # "step" is the optimizer's own time; its gradient reduction counts as "reduce".
            self.telemetry.seconds["step"] += (time.perf_counter() - start) - (
                self.telemetry.seconds["reduce"] - reduce_before
            )
            self.telemetry.steps += 1
            self.loss_scaler.update_scale(not applied)
            if applied:
                self._skips.applied()
                if self.lr_scheduler is not None:
                    self.lr_scheduler.step(**(lr_kwargs or {}))
            else:
                self.skipped_steps += 1
                self._skips.skipped(self.global_steps + 1, self.skipped_steps)
            self._step_applied = applied
            self.optimizer.after_step()  # the stage's whole-step bookkeeping (Note [Stage seam])
            self.global_steps += 1
            self.global_samples += self._accumulation.samples_this_step()
            scale = self.loss_scaler.loss_scale if self.fp16_enabled() else None
            self.monitor.step_ended(self.global_samples, self.get_lr(), scale)
            self._report_progress()
            # ZEROSTREAM_CHECK_COLLECTIVES=step: the ranks compare this step's collectives
            # (Note [Ranks that issue different collectives]).
            collective_check.step_ended()

    def _report_progress(self) -> None:
        every = self._config.steps_per_print
        if not every or self.global_steps % every != 0 or self.global_rank != 0:
            return
        logger.info(
            "step=%d, skipped=%d, lr=%s, mom=%s",
            self.global_steps,
            self.skipped_steps,
            self.get_lr(),
            self.get_mom(),
        )
        logger.info("telemetry: %s", self.telemetry.report())

    def _backward_epilogue(self) -> None:
        """DeepSpeed before 0.17 wanted it after a plain loss.backward(); here the backward's
        own gradient hooks queue the epilogue, which autograd ran when it finished (Note
        [A plain loss.backward()] in zero/base.py), so nothing is left to do."""
        self._parts.require_optimizer("_backward_epilogue")

    def zero_grad(self) -> None:
        for p in self.module.parameters():
            p.grad = None
        if self.optimizer is not None:
            self.optimizer.zero_grad()

    def was_step_applied(self) -> bool:
        return self._step_applied

    # --- between steps: calls on the GradientAccumulation it holds (accumulation.py) -----------
    is_gradient_accumulation_boundary = delegated(
        "_accumulation", GradientAccumulation.is_gradient_accumulation_boundary
    )
    set_gradient_accumulation_boundary = delegated(
        "_accumulation", GradientAccumulation.set_gradient_accumulation_boundary
    )
    no_sync = delegated("_accumulation", GradientAccumulation.no_sync)
    coalesce_grad_reduction = delegated(
        "_accumulation", GradientAccumulation.coalesce_grad_reduction
    )
    enable_backward_allreduce = property(
        delegated("_accumulation", GradientAccumulation.enable_backward_allreduce),
        delegated("_accumulation", GradientAccumulation.set_enable_backward_allreduce),
    )
    allreduce_gradients = delegated("_accumulation", GradientAccumulation.allreduce_gradients)

    # --- profiling: calls on the EngineProfiling it holds (profiling.py) -----------------------
    wall_clock_breakdown = delegated("_profiling", EngineProfiling.wall_clock_breakdown)

    @property
    def tput_timer(self):
        """DeepSpeed's throughput timer (profiling/throughput.py)."""
        return self._profiling.tput_timer

    get_wall_clock_timers = delegated("_profiling", EngineProfiling.get_wall_clock_timers)
    flops_profiler_enabled = delegated("_profiling", EngineProfiling.flops_profiler_enabled)
    flops_profiler_recompute_fwd_factor = delegated(
        "_profiling", EngineProfiling.flops_profiler_recompute_fwd_factor
    )
    flops_profiler_profile_step = delegated(
        "_profiling", EngineProfiling.flops_profiler_profile_step
    )
    flops_profiler_module_depth = delegated(
        "_profiling", EngineProfiling.flops_profiler_module_depth
    )
    flops_profiler_top_modules = delegated("_profiling", EngineProfiling.flops_profiler_top_modules)
    flops_profiler_detailed = delegated("_profiling", EngineProfiling.flops_profiler_detailed)
    flops_profiler_output_file = delegated("_profiling", EngineProfiling.flops_profiler_output_file)

    # --- DeepSpeed's accessors: calls on the Accessors the engine holds (accessors.py) ---------
    managed_gradient_accumulation = _accessor("managed_gradient_accumulation")
    train_batch_size = _accessor("train_batch_size")
    train_micro_batch_size_per_gpu = _accessor("train_micro_batch_size_per_gpu")
    gradient_accumulation_steps = _accessor("gradient_accumulation_steps")
    zero_optimization = _accessor("zero_optimization")
    zero_optimization_stage = _accessor("zero_optimization_stage")
    zero_optimization_partition_gradients = _accessor("zero_optimization_partition_gradients")
    zero_optimization_partition_weights = _accessor("zero_optimization_partition_weights")
    zero_offload_optimizer = _accessor("zero_offload_optimizer")
    zero_offload_param = _accessor("zero_offload_param")
    zero_cpu_offload = _accessor("zero_cpu_offload")
    zero_use_cpu_optimizer = _accessor("zero_use_cpu_optimizer")
    zero_gather_16bit_weights_on_model_save = _accessor("zero_gather_16bit_weights_on_model_save")
    fp16_enabled = _accessor("fp16_enabled")
    bfloat16_enabled = _accessor("bfloat16_enabled")
    gradient_clipping = _accessor("gradient_clipping")
    dynamic_loss_scale = _accessor("dynamic_loss_scale")
    steps_per_print = _accessor("steps_per_print")
    communication_data_type = property(_accessor("communication_data_type"))

    loss_scale = _accessor("loss_scale")
    get_lr = _accessor("get_lr")
    get_mom = _accessor("get_mom")
    get_global_grad_norm = _accessor("get_global_grad_norm")

    @property
    def sparse_tensor_module_names(self) -> set:
        """DeepSpeed's modules with sparse gradients: none (sparse_gradients is refused by
        name), so the set is empty on every engine, as DeepSpeed's checkpoint tests compare."""
        return set()

    # --- checkpoints: calls on the EngineCheckpoints the engine holds (checkpoints.py) ---------
    save_checkpoint = delegated("_checkpoints", EngineCheckpoints.save_checkpoint)
    load_checkpoint = delegated("_checkpoints", EngineCheckpoints.load_checkpoint)
    save_16bit_model = delegated("_checkpoints", EngineCheckpoints.save_16bit_model)
    save_fp16_model = save_16bit_model
    _checkpoint_target = delegated("_checkpoints", EngineCheckpoints.target)  # tests read it
    checkpoint_engine = field_of("_checkpoints", "checkpoint_engine")
    _get_optimizer_ckpt_name = delegated("_checkpoints", EngineCheckpoints._get_optimizer_ckpt_name)
    _zero3_consolidated_16bit_state_dict = delegated(
        "_checkpoints", EngineCheckpoints._zero3_consolidated_16bit_state_dict
    )

    # --- stage-3 housekeeping -------------------------------------------------------------------
    def empty_partition_cache(self) -> None:
        """Stage 3: releases every gathered parameter that is not persistent."""
        self._stage.release_gathered(self.module)

    def offload_states(self, include=None, device="cpu", pin_memory=True, non_blocking=False):
        """Parks the ZeRO state kinds in `include` (DeepSpeed's OffloadStateTypeEnum values;
        None: all) in host memory until reload_states (Note [Parking state in host memory])."""
        offload_engine_states(self, include, device, pin_memory, non_blocking)

    def reload_states(self, non_blocking: bool = False) -> None:
        """Brings back what offload_states moved; training goes on as if it never had."""
        reload_engine_states(self, non_blocking)

    def destroy(self) -> None:
        """Ends the engine: stage 3's module hooks go (parameters stay partitioned) and the
        swap files of NVMe offload are deleted, their directories given up."""
        self._stage.close(self.module, self.optimizer)
        if self._retains_host_memory:  # Note [Fresh pages cost more than the math]
            self._retains_host_memory = False
            host_malloc.release()

    def compile(self, backend=None, compile_kwargs=None, **kwargs) -> None:
        """DeepSpeed's engine.compile (Accelerate calls it when a dynamo backend is set);
        torch.Module.compile would otherwise take the call and fail on its arguments."""
        raise NotImplementedError(
            "engine.compile: torch.compile of a zerostream engine (DeepSpeed's "
            "engine.compile, Accelerate's dynamo_backend) is not supported; run uncompiled"
        )

    def get_batch_info(self):
        return (
            self.train_batch_size(),
            self.train_micro_batch_size_per_gpu(),
            self.gradient_accumulation_steps(),
        )

    def __getattr__(self, name):
        """Attributes the engine lacks come from the wrapped module (as in DeepSpeed); a name
        neither has is reported against the engine, not the module."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            pass
        module = self._modules.get("module")
        if module is not None:
            try:
                return getattr(module, name)
            except AttributeError:
                pass
        raise AttributeError(
            f"'{type(self).__name__}' object has no attribute '{name}' "
            f"(nor has its module {type(module).__name__})"
        )

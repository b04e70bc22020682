"""ZeroEngine: DeepSpeed's training loop (forward, backward, step, accumulation, clipping,
precision, schedulers) over the ZeRO optimizer wrappers in zero/."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Optional

import torch

from . import autocast, collective_check, comm, host_malloc
from .accelerator import bind_run_device
from .config import DeepSpeedConfig
from .engine_accessors import ConfigAccessors
from .engine_checkpoints import CheckpointMethods
from .lr_schedules import build_scheduler
from .monitor import EngineMonitor
from .offload.memory_preflight import STEP_PEAKS
from .optim_factory import client_groups, param_groups_of
from .precision import make_loss_scaler
from .telemetry import StepTelemetry
from .unsupported import refuse_unsupported
from .zero.factory import build_zero_optimizer, stage_class
from .zero.protocol import RunState, StageContext, TrainingState
from .zero.skips import SkipGuard
from .zero.state_offload import offload_engine_states, reload_engine_states

logger = logging.getLogger("zerostream")


class NoSyncError(RuntimeError, ValueError, AssertionError):
    """A misuse of no_sync(). DeepSpeed asserts these (its message is quoted in ours), so
    code that catches AssertionError, DeepSpeed's tests among it, catches them too; the
    RuntimeError (step, re-entry) and ValueError (stage) zerostream raised before, too."""


class ZeroEngine(ConfigAccessors, CheckpointMethods, torch.nn.Module):
    """What `zerostream.initialize` returns. Attributes and methods follow DeepSpeedEngine.

    The engine runs the loop and owns the phase (`training_state`); everything about where
    parameters, gradients and optimizer state live belongs to the stage's ZeRO optimizer
    (zero/protocol.py, Note [Stage seam])."""

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
        self.global_rank = comm.get_rank()
        self.world_size = comm.get_world_size()
        self.dp_world_size = comm.get_world_size(dp_group)
        self.mp_world_size = 1
        self.local_rank = comm.get_local_rank()
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        self._step_applied = False
        self._boundary_override: Optional[bool] = None
        self._in_no_sync = False  # no_sync() or coalesce_grad_reduction() is open
        self._backward_allreduce = True  # enable_backward_allreduce
        self.pipeline_parallelism = False  # PipelineModule is refused (unsupported.py)
        # managed_gradient_accumulation false: the caller owns the boundary; every step()
        # is one, and the backwards since the last count the samples (Note [Who owns the
        # accumulation boundary]).
        self._managed_accumulation = cfg.managed_gradient_accumulation
        self._unmanaged_backwards = 0
        self._running_step = False
        self._parked = None  # what offload_states moved to host memory (zero/state_offload.py)
        self.loss_scaler = make_loss_scaler(cfg.fp16)
        device = self._device()
        self.telemetry = StepTelemetry(issue_timed=device.type == "cuda")
        self._run = RunState()
        ctx = StageContext(
            config=cfg,
            group=dp_group,
            rank=comm.get_rank(dp_group),
            world=self.dp_world_size,
            device=device,
            loss_scaler=self.loss_scaler,
            run=self._run,
            telemetry=self.telemetry,
        )
        self.device = ctx.device
        groups = param_groups_of(model, model_parameters)
        refuse_unsupported(cfg, model, client_groups(optimizer, groups))
        self.monitor = EngineMonitor(cfg.monitor_config)  # rank 0 writes (monitor/)
        comm.configure(cfg)  # the comms_logger section, when given (comms_logging.py)
        # The stage's class, looked up once: what differs between stages is its attributes
        # and methods (zero/protocol.py), not branches here.
        self._stage = stage_class(cfg.zero_stage)
        self._stage.prepare_module(model, ctx)
        self.optimizer = build_zero_optimizer(ctx, groups, client=optimizer)
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
        if cfg.zero_optimization.round_robin_gradients and cfg.zero_stage in (1, 2):
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

    @contextlib.contextmanager
    def _phase(self, state: TrainingState):
        previous, self._run.state = self._run.state, state
        try:
            yield
        finally:
            self._run.state = previous

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
        with self._phase(TrainingState.FORWARD), self.telemetry.phase("forward"):
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

    def _require_optimizer(self, what: str) -> None:
        if self.optimizer is None:
            raise RuntimeError(
                f"{what}: must provide optimizer during init in order to use backward/step"
            )

    def backward(
        self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True
    ) -> torch.Tensor:
        """Scales the loss (accumulation and fp16 loss scale), runs autograd and starts the
        gradient reductions. Returns loss / gradient_accumulation_steps, as DeepSpeed does."""
        self._require_optimizer("backward")
        self._require_consistent("backward")
        gas = self.gradient_accumulation_steps() if scale_wrt_gas else 1
        # The optimizer runs it in the BACKWARD phase (the one path for optimizer.backward).
        self.optimizer.run_backward(loss, self.loss_scaler.loss_scale / gas, retain_graph)
        self.monitor.backward_seen(loss, gas, self.global_samples)
        if not self._managed_accumulation:
            self._unmanaged_backwards += 1
        return loss.detach() / gas

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` times the fp16 loss scale (1 otherwise), for a caller that runs
        `loss.backward()` itself and then `step()` (DeepSpeed's engine.scale; not divided by
        gradient_accumulation_steps, as there)."""
        self._require_optimizer("scale")
        if not (torch.is_tensor(loss) and loss.numel() == 1 and loss.grad_fn is not None):
            raise AssertionError(
                "scale: loss must be a scalar tensor with grad_fn; for a non-scalar tensor, "
                "call tensor.backward(grad)"
            )
        scale = self.loss_scaler.loss_scale
        return loss * scale if scale != 1 else loss

    def managed_gradient_accumulation(self) -> bool:
        return self._managed_accumulation

    def log_level(self):
        """The config's `log_level` (None: the logger's own level stays)."""
        return self._config.log_level

    def step(self, lr_kwargs: Optional[dict] = None) -> None:
        """Applies the optimizer at the accumulation boundary only: reduce, unscale, clip, step,
        and the LR schedule unless the step overflowed (then it is skipped)."""
        self._require_optimizer("step")
        self._require_consistent("step")
        if self._in_no_sync:
            raise NoSyncError(
                "step: no step is allowed inside no_sync() (It is illegal to call "
                "Engine.step() inside no_sync context manager)"
            )
        self._running_step = True
        try:
            self._step(lr_kwargs)
        finally:
            self._running_step = False
        self.micro_steps += 1
        self._boundary_override = None

    def _step(self, lr_kwargs: Optional[dict]) -> None:
        boundary = self.is_gradient_accumulation_boundary()
        self._step_applied = False
        if boundary:
            start = time.perf_counter()
            reduce_before = self.telemetry.seconds["reduce"]
            with self._phase(TrainingState.STEP):
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
            # Before the window closes: "retain" gives its free pages back while "auto" tiers
            # wait (Note [Fresh pages cost more than the math])
            host_malloc.settle(bool(STEP_PEAKS.waiting))
            STEP_PEAKS.step_ended()  # "auto" tiers size from whole steps (Note [A step's excess])
            self.global_steps += 1
            self.global_samples += self._samples_this_step()
            scale = self.loss_scaler.loss_scale if self.fp16_enabled() else None
            self.monitor.step_ended(self.global_samples, self.get_lr(), scale)
            self._report_progress()
            # ZEROSTREAM_CHECK_COLLECTIVES=step: the ranks compare this step's collectives
            # (Note [Ranks that issue different collectives]).
            collective_check.step_ended()

    def _samples_this_step(self) -> int:
        if self._managed_accumulation:
            return self.train_batch_size()
        per_micro = self.train_batch_size() // self.gradient_accumulation_steps()
        samples, self._unmanaged_backwards = per_micro * self._unmanaged_backwards, 0
        return samples

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

    # --- accumulation ---------------------------------------------------------------------------
    # Note [Who owns the accumulation boundary]
    # Managed (DeepSpeed's default): the engine counts micro-steps; the caller calls step()
    # after every backward and the update happens on every gradient_accumulation_steps-th.
    # With `managed_gradient_accumulation: false` the caller owns the boundary: it runs any
    # number of backwards and then step(), and every step() reduces what was accumulated and
    # updates. The loss is still divided by gradient_accumulation_steps (scale_wrt_gas), the
    # boundary is True only while step() runs, global_samples advances by the micro-batches
    # actually run, and set_gradient_accumulation_boundary is refused, as in DeepSpeed.
    # zerostream's stages accumulate in backward without asking about the boundary (stages
    # 2/3 reduce into their partitions as gradients arrive, 0/1 at the step), so only the
    # engine's bookkeeping changes.
    def is_gradient_accumulation_boundary(self) -> bool:
        if not self._managed_accumulation:
            return self._running_step
        if self._boundary_override is not None:
            return self._boundary_override
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        if not self._managed_accumulation:
            raise NoSyncError(
                "set_gradient_accumulation_boundary: not allowed with "
                "managed_gradient_accumulation false; the caller owns the boundary by calling "
                "step()"
            )
        self._boundary_override = bool(is_boundary)

    @contextlib.contextmanager
    def no_sync(self):
        """Skips gradient reduction inside the context (stages 0 and 1 only)."""
        if self.zero_optimization_stage() >= 2:
            raise NoSyncError(
                f"no_sync is not compatible with ZeRO stage "
                f"{self.zero_optimization_stage()}: gradients are partitioned as "
                f"they are produced (no_sync context manager is incompatible with gradient "
                f"partitioning logic of ZeRO stage {self.zero_optimization_stage()})"
            )
        if self._in_no_sync:
            raise NoSyncError(
                "no_sync: the context is not re-entrant (no_sync context manager reentry is "
                "unsupported)"
            )
        self._in_no_sync = True
        try:
            yield
        finally:
            self._in_no_sync = False

    @contextlib.contextmanager
    def coalesce_grad_reduction(self):
        """One gradient reduction for all the backwards inside the block (DeepSpeed's): they
        accumulate locally and the block's end reduces once; step() comes after the block.
        Note [Coalesced reduction] in zero/base.py. Unlike DeepSpeed, stage 0 and ZeRO-1's
        bf16 wrapper are not refused (they reduce at the step anyway)."""
        self._require_optimizer("coalesce_grad_reduction")
        if not self._managed_accumulation:
            raise NoSyncError(
                "coalesce_grad_reduction is not supported with managed_gradient_accumulation "
                "false: the caller already owns the accumulation boundary through step()"
            )
        if self.pipeline_parallelism:
            raise NotImplementedError(
                "coalesce_grad_reduction is not supported under pipeline parallelism"
            )
        if self._in_no_sync:
            raise NoSyncError(
                "coalesce_grad_reduction cannot be nested inside another no_sync or "
                "coalesce_grad_reduction context"
            )
        self._in_no_sync = True
        self.optimizer.begin_coalescing()
        try:
            yield
        except BaseException:
            self._in_no_sync = False
            self.optimizer.end_coalescing(reduce=False)
            raise
        self._in_no_sync = False
        with self._phase(TrainingState.BACKWARD):
            self.optimizer.end_coalescing()

    @property
    def enable_backward_allreduce(self) -> bool:
        """DeepSpeed's switch for the engine's own gradient averaging. Set False at ZeRO
        stage 0, the caller reduces the gradients itself (its own hooks, or
        allreduce_gradients()) and step() applies them as they are. Stages 1-3 reduce into
        partitions as part of the step's math: refused there by name."""
        return self._backward_allreduce

    @enable_backward_allreduce.setter
    def enable_backward_allreduce(self, value: bool) -> None:
        value = bool(value)
        stage = self.zero_optimization_stage()
        if not value and stage > 0:
            raise NotImplementedError(
                f"enable_backward_allreduce = False is supported at ZeRO stage 0 only; at "
                f"stage {stage} zerostream reduces gradients into this rank's partition as "
                f"part of the step (use no_sync() or coalesce_grad_reduction() to defer it)"
            )
        self._backward_allreduce = value
        if self.optimizer is not None:
            self.optimizer.backward_allreduce = value

    def allreduce_gradients(self, bucket_size: Optional[int] = None) -> None:
        """DeepSpeed's: reduce the gradients of the backwards so far across the
        data-parallel ranks, at the accumulation boundary. At stage 0 they are averaged now
        (also with enable_backward_allreduce False), and the step does not reduce them
        again. Stages 1-3 have nothing left to do here: their backward reduced into the
        partitions already (stage 1 reduces in the step), so it is a no-op there, as the
        repeat of a finished reduction is in DeepSpeed. `bucket_size` is accepted for
        DeepSpeed's signature; the buckets are zero_optimization.reduce_bucket_size."""
        self._require_optimizer("allreduce_gradients")
        if self.zero_optimization_stage() == 0 and self.is_gradient_accumulation_boundary():
            self.optimizer.allreduce_now()

    def _backward_epilogue(self) -> None:
        """DeepSpeed before 0.17 wanted it after a plain loss.backward(); here the backward's
        own gradient hooks queue the epilogue, which autograd ran when it finished (Note
        [A plain loss.backward()] in zero/base.py), so nothing is left to do."""
        self._require_optimizer("_backward_epilogue")

    def zero_grad(self) -> None:
        for p in self.module.parameters():
            p.grad = None
        if self.optimizer is not None:
            self.optimizer.zero_grad()

    def was_step_applied(self) -> bool:
        return self._step_applied

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

"""ZeroEngine: DeepSpeed's training loop (forward, backward, step, accumulation, clipping,
precision, schedulers) over the ZeRO optimizer wrappers in zero/."""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Optional

import torch

from . import comm
from .accelerator import get_accelerator
from .config import DeepSpeedConfig
from .lr_schedules import build_scheduler
from .optim_factory import client_groups, optimizer_maker, param_groups_of
from .precision import make_loss_scaler
from .telemetry import StepTelemetry
from .zero.stage0 import ReplicatedOptimizer
from .offload.optimizer_swap import SwappedAdam
from .zero.stage12 import OffloadSpec, PartitionedOptimizer

logger = logging.getLogger("zerostream")

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


class ZeroEngine(torch.nn.Module):
    """What `zerostream.initialize` returns. Attributes and methods follow DeepSpeedEngine."""

    def __init__(self, model: torch.nn.Module, cfg: DeepSpeedConfig, optimizer=None,
                 model_parameters=None, lr_scheduler=None, dp_group=None):
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
        self.device = self._place_module()
        self._broadcast_model()
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        self._step_applied = False
        self._boundary_override: Optional[bool] = None
        self._in_no_sync = False
        self.loss_scaler = make_loss_scaler(cfg.fp16 if cfg.fp16.enabled else None)
        self.optimizer = self._build_optimizer(optimizer, model_parameters)
        self.basic_optimizer = self.optimizer.optimizer if self.optimizer is not None else None
        self.lr_scheduler = self._build_scheduler(lr_scheduler)
        self.telemetry = StepTelemetry()
        if self.optimizer is not None:
            self.optimizer.telemetry = self.telemetry
            self.optimizer.check_overflow = not (cfg.bf16.enabled and
                                                 not cfg.bf16.check_grad_overflow)
        if cfg.zero_optimization.round_robin_gradients and cfg.zero_stage in (1, 2):
            logger.warning("zero_optimization.round_robin_gradients: zerostream partitions "
                           "gradients in flat parameter order; the setting has no effect")

    # --- setup ----------------------------------------------------------------------------------
    def _place_module(self) -> torch.device:
        acc = get_accelerator()
        device = torch.device(acc.device_name(self.local_rank) if acc.device_name() == "cuda"
                              else "cpu")
        dtype = _DTYPES[self._config.precision]
        # Parameters only: fp32 buffers (rotary inv_freq, norms' running stats) keep their dtype.
        for p in self.module.parameters():
            p.data = p.data.to(device=device, dtype=dtype if p.is_floating_point() else p.dtype)
        for b_name, b in self.module.named_buffers():
            b.data = b.data.to(device)
        return device

    def _broadcast_model(self) -> None:
        """Rank 0's weights win, as in DeepSpeed, so ranks start from one model."""
        if self.dp_world_size == 1:
            return
        src = comm.get_global_rank(self.dp_process_group, 0)
        with torch.no_grad():
            for t in list(self.module.parameters()) + list(self.module.buffers()):
                comm.broadcast(t.data, src, group=self.dp_process_group)

    def _build_optimizer(self, client, model_parameters):
        cfg = self._config
        groups = client_groups(client, param_groups_of(self.module, model_parameters))
        make = optimizer_maker(client, cfg, groups)
        stage = cfg.zero_stage
        if make is None:
            if stage in (1, 2):
                raise ValueError(f"zero_optimization.stage {stage} requires an optimizer: give "
                                 f"one in the config's \"optimizer\" section or to initialize()")
            return None
        if stage == 3:
            raise NotImplementedError("zero_optimization.stage 3 is not implemented yet in this "
                                      "build of zerostream; use stage 0, 1 or 2")
        common = dict(zero_cfg=cfg.zero_optimization, loss_scaler=self.loss_scaler,
                      clip=cfg.gradient_clipping, group=self.dp_process_group)
        if stage == 0:
            # The config check warned: offload_optimizer has no effect without ZeRO.
            return ReplicatedOptimizer(groups, make, prescale_gradients=cfg.prescale_gradients,
                                       gradient_predivide_factor=cfg.gradient_predivide_factor,
                                       **common)
        return PartitionedOptimizer(groups, make, stage=stage, offload=self._offload_spec(),
                                    **common)

    def _offload_spec(self) -> OffloadSpec:
        cfg = self._config
        device = cfg.zero_optimization.offload_optimizer_device
        if device == "none":
            return OffloadSpec()
        oo = cfg.zero_optimization.offload_optimizer
        if device == "cpu":
            return OffloadSpec("cpu", pin_memory=oo.pin_memory)
        opt = cfg.optimizer
        if opt is None or opt.type.lower() not in ("adam", "adamw") or opt.params.get("torch_adam"):
            raise NotImplementedError(
                "zero_optimization.offload_optimizer.device \"nvme\" keeps Adam/AdamW state on "
                "NVMe; give \"optimizer\": {\"type\": \"AdamW\", ...} in the config (client "
                "optimizers and other types are not supported with nvme yet)")
        params = dict(opt.params)
        defaults = {"lr": params.get("lr", 1e-3), "betas": tuple(params.get("betas", (0.9, 0.999))),
                    "eps": params.get("eps", 1e-8), "weight_decay": params.get("weight_decay", 0.0),
                    "bias_correction": params.get("bias_correction", True)}
        adamw = opt.type.lower() == "adamw" or params.get("adam_w_mode", True)

        def factory(masters, options, rank, stage):
            return SwappedAdam(masters, options, defaults, adamw_mode=adamw,
                               sub_group_size=cfg.zero_optimization.sub_group_size,
                               offload_cfg=oo, aio_cfg=cfg.aio,
                               verify_checksums=cfg.zerostream.verify_swap_checksums,
                               threads=cfg.zerostream.cpu_optimizer_threads or None,
                               stage=stage, rank=comm.get_rank())
        return OffloadSpec("nvme", pin_memory=oo.pin_memory, swapper_factory=factory)

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
    def forward(self, *args, **kwargs):
        if self._config.fp16.enabled and self._config.fp16.auto_cast:
            cast = lambda x: x.half() if torch.is_tensor(x) and x.is_floating_point() else x
            args = tuple(cast(a) for a in args)
            kwargs = {k: cast(v) for k, v in kwargs.items()}
        with self.telemetry.phase("forward"):
            return self.module(*args, **kwargs)

    def _require_optimizer(self, what: str) -> None:
        if self.optimizer is None:
            raise RuntimeError(f"{what}: must provide optimizer during init in order to use "
                               f"backward/step")

    def backward(self, loss: torch.Tensor, retain_graph: bool = False,
                 scale_wrt_gas: bool = True) -> torch.Tensor:
        """Scales the loss (accumulation and fp16 loss scale), runs autograd and starts the
        gradient reductions. Returns loss / gradient_accumulation_steps, as DeepSpeed does."""
        self._require_optimizer("backward")
        if not torch.is_tensor(loss) or loss.numel() != 1 or loss.grad_fn is None:
            raise ValueError("backward: expected a scalar loss tensor with a grad_fn")
        gas = self.gradient_accumulation_steps() if scale_wrt_gas else 1
        with self.telemetry.phase("backward"):
            scaled = loss.float() * (self.loss_scaler.loss_scale / gas)
            scaled.backward(retain_graph=retain_graph)
        self.optimizer.after_backward()
        return loss.detach() / gas

    def step(self, lr_kwargs: Optional[dict] = None) -> None:
        """Applies the optimizer at the accumulation boundary only: reduce, unscale, clip, step,
        and the LR schedule unless the step overflowed (then it is skipped)."""
        self._require_optimizer("step")
        if self._in_no_sync:
            raise RuntimeError("step: no step is allowed inside no_sync()")
        boundary = self.is_gradient_accumulation_boundary()
        self._step_applied = False
        if boundary:
            start = time.perf_counter()
            reduce_before = self.telemetry.seconds["reduce"]
            applied = self.optimizer.step()
            # "step" is the optimizer's own time; its gradient reduction counts as "reduce".
            self.telemetry.seconds["step"] += (time.perf_counter() - start) - (
                self.telemetry.seconds["reduce"] - reduce_before)
            self.telemetry.steps += 1
            self.loss_scaler.update_scale(not applied)
            if applied:
                if self.lr_scheduler is not None:
                    self.lr_scheduler.step(**(lr_kwargs or {}))
            else:
                self.skipped_steps += 1
            self._step_applied = applied
            self.global_steps += 1
            self.global_samples += self.train_batch_size()
            self._report_progress()
        self.micro_steps += 1
        self._boundary_override = None

    def _report_progress(self) -> None:
        every = self._config.steps_per_print
        if not every or self.global_steps % every != 0 or self.global_rank != 0:
            return
        logger.info("step=%d, skipped=%d, lr=%s, mom=%s", self.global_steps, self.skipped_steps,
                    self.get_lr(), self.get_mom())
        logger.info("telemetry: %s", self.telemetry.report())

    # --- accumulation ---------------------------------------------------------------------------
    def is_gradient_accumulation_boundary(self) -> bool:
        if self._boundary_override is not None:
            return self._boundary_override
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        self._boundary_override = bool(is_boundary)

    @contextlib.contextmanager
    def no_sync(self):
        """Skips gradient reduction inside the context (stages 0 and 1 only)."""
        if self.zero_optimization_stage() >= 2:
            raise ValueError(f"no_sync is not compatible with ZeRO stage "
                             f"{self.zero_optimization_stage()}: gradients are partitioned as "
                             f"they are produced")
        if self._in_no_sync:
            raise RuntimeError("no_sync: the context is not re-entrant")
        self._in_no_sync = True
        try:
            yield
        finally:
            self._in_no_sync = False

    def zero_grad(self) -> None:
        for p in self.module.parameters():
            p.grad = None
        if self.optimizer is not None:
            self.optimizer.zero_grad()

    def was_step_applied(self) -> bool:
        return self._step_applied

    # --- accessors ------------------------------------------------------------------------------
    def train_batch_size(self) -> int:
        return self._config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self._config.gradient_accumulation_steps

    def zero_optimization(self) -> bool:
        return self._config.zero_stage > 0

    def zero_optimization_stage(self) -> int:
        return self._config.zero_stage

    def zero_optimization_partition_gradients(self) -> bool:
        return self._config.zero_stage >= 2

    def zero_optimization_partition_weights(self) -> bool:
        return self._config.zero_stage >= 3

    def zero_offload_optimizer(self):
        return self._config.zero_optimization.offload_optimizer

    def zero_offload_param(self):
        return self._config.zero_optimization.offload_param

    def zero_cpu_offload(self) -> bool:
        return self._config.zero_optimization.offload_optimizer_device == "cpu"

    def fp16_enabled(self) -> bool:
        return self._config.fp16.enabled

    def bfloat16_enabled(self) -> bool:
        return self._config.bf16.enabled

    def gradient_clipping(self) -> float:
        return self._config.gradient_clipping

    def dynamic_loss_scale(self) -> bool:
        return self._config.fp16.enabled and self._config.fp16.loss_scale == 0

    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale

    def steps_per_print(self):
        return self._config.steps_per_print

    @property
    def communication_data_type(self) -> torch.dtype:
        return _DTYPES[self._config.communication_data_type]

    def get_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups] if self.optimizer else []

    def get_mom(self):
        if self.optimizer is None:
            return []
        return [g.get("betas", g.get("momentum")) for g in self.optimizer.param_groups]

    def get_global_grad_norm(self):
        return None if self.optimizer is None else self.optimizer._global_grad_norm

    def get_batch_info(self):
        return (self.train_batch_size(), self.train_micro_batch_size_per_gpu(),
                self.gradient_accumulation_steps())

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self._modules.get("module")
            if module is None:
                raise
            return getattr(module, name)

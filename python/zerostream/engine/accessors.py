"""DeepSpeed's read-only accessors (`engine.train_batch_size()`, `zero_optimization_stage()`,
`get_lr()`, ...): what Accelerate, Lightning and the HF Trainer ask a DeepSpeed engine about
its config, optimizer and loss scale. A collaborator the engine holds, built from the config,
the TrainingParts record and the loss scaler; the engine's methods of the same names call it."""

from __future__ import annotations

import torch

from ..config import DeepSpeedConfig
from ..precision import DTYPES, LossScaler
from .records import TrainingParts


class Accessors:
    def __init__(self, config: DeepSpeedConfig, parts: TrainingParts, loss_scaler: LossScaler):
        self._config = config
        self._parts = parts
        self._loss_scaler = loss_scaler

    def train_batch_size(self) -> int:
        return self._config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self._config.gradient_accumulation_steps

    def managed_gradient_accumulation(self) -> bool:
        return self._config.managed_gradient_accumulation

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

    def zero_use_cpu_optimizer(self) -> bool:
        return self._config.zero_optimization.offload_optimizer_device in ("cpu", "nvme")

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        """Accelerate's get_state_dict asks before gathering stage-3 weights."""
        return self._config.zero_optimization.stage3_gather_16bit_weights_on_model_save

    def fp16_enabled(self) -> bool:
        return self._config.fp16.enabled

    def bfloat16_enabled(self) -> bool:
        return self._config.bf16.enabled

    def gradient_clipping(self) -> float:
        return self._config.gradient_clipping

    def dynamic_loss_scale(self) -> bool:
        return self._config.fp16.enabled and self._config.fp16.loss_scale == 0

    def steps_per_print(self):
        return self._config.steps_per_print

    def communication_data_type(self) -> torch.dtype:
        return DTYPES[self._config.communication_data_type]

    def loss_scale(self) -> float:
        return self._loss_scaler.loss_scale

    def get_lr(self):
        optimizer = self._parts.optimizer
        return [g["lr"] for g in optimizer.param_groups] if optimizer else []

    def get_mom(self):
        optimizer = self._parts.optimizer
        if optimizer is None:
            return []
        return [g.get("betas", g.get("momentum")) for g in optimizer.param_groups]

    def get_global_grad_norm(self):
        optimizer = self._parts.optimizer
        return None if optimizer is None else optimizer.global_grad_norm

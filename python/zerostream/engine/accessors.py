"""The engine's read-only accessors of its config and optimizer, by DeepSpeed's names
(`engine.train_batch_size()`, `zero_optimization_stage()`, `get_lr()`, ...): what Accelerate,
Lightning and the HF Trainer ask a DeepSpeed engine. Mixed into engine.ZeroEngine, whose
`_config`, `optimizer` and `loss_scaler` they read."""

from __future__ import annotations

import torch

from ..precision import DTYPES


class ConfigAccessors:
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

    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale

    def steps_per_print(self):
        return self._config.steps_per_print

    @property
    def sparse_tensor_module_names(self) -> set:
        """DeepSpeed's modules with sparse gradients: none (sparse_gradients is refused by
        name), so the set is empty on every engine, as DeepSpeed's checkpoint tests compare."""
        return set()

    @property
    def communication_data_type(self) -> torch.dtype:
        return DTYPES[self._config.communication_data_type]

    def get_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups] if self.optimizer else []

    def get_mom(self):
        if self.optimizer is None:
            return []
        return [g.get("betas", g.get("momentum")) for g in self.optimizer.param_groups]

    def get_global_grad_norm(self):
        return None if self.optimizer is None else self.optimizer.global_grad_norm

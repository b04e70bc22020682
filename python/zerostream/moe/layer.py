"""`deepspeed.moe.layer.MoE`: refused at construction (see the package doc)."""

from __future__ import annotations

import torch

EXPERT_PARALLELISM = "Mixture-of-Experts with expert parallelism (deepspeed.moe.layer.MoE)"


class MoE(torch.nn.Module):
    """DeepSpeed's expert-parallel MoE layer. zerostream cannot run it: constructing one
    raises NotImplementedError naming the feature, before any process group or expert
    weights are created."""

    def __init__(
        self,
        hidden_size: int = None,
        expert: torch.nn.Module = None,
        num_experts: int = 1,
        ep_size: int = 1,
        k: int = 1,
        *args,
        **kwargs,
    ):
        raise NotImplementedError(
            f"{EXPERT_PARALLELISM} is not supported by zerostream (asked for "
            f"num_experts={num_experts}, ep_size={ep_size}, k={k}): it has no expert-parallel "
            "groups or all-to-all token dispatch. Build the experts as ordinary modules (as "
            "Hugging Face MoE models do) to train them with ZeRO data parallelism, or run "
            "this model with DeepSpeed."
        )

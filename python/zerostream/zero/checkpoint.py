"""The checkpoint side of stages 0-2 (Note [Stage checkpoints] in zero/protocol.py): every
rank holds the whole weights, so DP rank 0 writes them and every rank reads them whole,
large tensors straight from the file into the module's own (lazy_tensor.py)."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch

from ..lazy_tensor import LazyTensor, copy_into, materialize
from .protocol import PartitionLayout, SavedWeights


class StageCheckpointBase:
    """The optimizer side every stage shares: its layout and state are the optimizer's own
    (partition_layout, state_dict, load_state_dict); a run without one has neither."""

    def __init__(self, module: torch.nn.Module, optimizer):
        self.module, self.optimizer = module, optimizer

    def partition_layout(self) -> Optional[PartitionLayout]:
        return None if self.optimizer is None else self.optimizer.partition_layout()

    def save_partition_state(self, streamed: bool = False) -> dict:
        return self.optimizer.state_dict(streamed=streamed)

    def load_partition_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state, publish=False)


class WholeWeightsCheckpoint(StageCheckpointBase):
    """StageCheckpoint of stages 0-2 (the optimizer's layout: whole at stage 0, flat
    partitions at 1/2)."""

    sharded_weights = False

    def frozen_values(self, named: List[Tuple[str, torch.nn.Parameter]]) -> Dict[str, torch.Tensor]:
        return {name: p.detach() for name, p in named}

    def load_module(
        self,
        saved: SavedWeights,
        strict: bool,
        custom_load_fn: Optional[Callable],
        with_optimizer: bool,
    ) -> None:
        """The whole weights from this rank's file; from a sharded (stage-3) checkpoint the
        buffers from it and the weights consolidated from every rank's fp32 partitions (cast
        to the module's dtype by load_state_dict), or, when the optimizer state is loaded
        next (it writes the trained weights), the frozen ones only: the optimizer files are
        then read once."""
        if not saved.sharded:
            load_whole(self.module, saved.module, strict, custom_load_fn)
            return
        buffers = {n: saved.module[n] for n in saved.buffer_names if n in saved.module}
        if with_optimizer and custom_load_fn is None:
            load_whole(self.module, {**saved.frozen(), **buffers}, strict=False)
            return
        load_whole(self.module, {**saved.consolidated(), **buffers}, strict, custom_load_fn)

    def loaded_without_optimizer(self) -> None:
        """fp32 masters from the weights just loaded, as DeepSpeed does."""
        if self.optimizer is not None:
            self.optimizer.refresh_masters()

    def publish_loaded(self, with_optimizer: bool) -> None:
        if with_optimizer and self.optimizer is not None:
            self.optimizer.publish_loaded()


def load_whole(
    module: torch.nn.Module, saved: dict, strict: bool, custom_load_fn: Optional[Callable] = None
) -> None:
    """Whole weights into `module`. Saved LazyTensors are read straight into the module's own
    tensors, so the weights are never in memory twice; the rest goes through
    load_state_dict."""
    if custom_load_fn is not None:
        custom_load_fn(src=materialize(saved), dst=module)
        return
    own = module.state_dict(keep_vars=True)
    lazy = {k: v for k, v in saved.items() if isinstance(v, LazyTensor) and k in own}
    for key, src in lazy.items():
        dst = own[key]
        if tuple(src.shape) != tuple(dst.shape):
            raise RuntimeError(
                f"load_checkpoint: {key!r} has shape {tuple(src.shape)} in the checkpoint and "
                f"{tuple(dst.shape)} in the model"
            )
        with torch.no_grad():
            copy_into(dst.data, src)
    # Large tensors the model has no place for are reported, never read.
    unread = [k for k, v in saved.items() if isinstance(v, LazyTensor) and k not in own]
    rest = {k: v for k, v in saved.items() if k not in lazy and k not in unread}
    result = module.load_state_dict(materialize(rest), strict=False)
    unexpected = list(result.unexpected_keys) + unread
    missing = [k for k in result.missing_keys if k not in lazy]
    if strict and (missing or unexpected):
        raise RuntimeError(
            f"load_checkpoint: the checkpoint's module state does not match the model "
            f"(missing keys {missing}, unexpected keys {unexpected}); pass "
            f"load_module_strict=False to load what matches"
        )

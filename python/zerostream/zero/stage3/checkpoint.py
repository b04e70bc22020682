"""The checkpoint side of stage 3 (Note [Stage checkpoints] in zero/protocol.py): each rank
holds shards of the weights, so every rank writes its own model-states file (its shards of
the frozen params) and a load writes shards: of the trained params from the optimizer's
partitions when those are loaded (the optimizer's state_dict layout, optimizer.py), else
from the checkpoint's whole values; of the frozen ones from this rank's file, or re-cut
from every rank's when the world size changed."""

from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Tuple

import torch

from ..checkpoint import StageCheckpointBase
from ..protocol import SavedWeights
from .param import zero_param_of

logger = logging.getLogger("zerostream")


class Stage3Checkpoint(StageCheckpointBase):
    """StageCheckpoint of stage 3, over the module's Stage3Runtime (which a run without an
    optimizer has too) and the optimizer, if any."""

    sharded_weights = True

    def __init__(self, module: torch.nn.Module, runtime, optimizer):
        super().__init__(module, optimizer)
        self.runtime = runtime

    def frozen_values(self, named: List[Tuple[str, torch.nn.Parameter]]) -> Dict[str, torch.Tensor]:
        """This rank's shard of each frozen param (read back from disk with offload_param
        nvme); a param the stage does not partition, whole."""
        out = {}
        for name, p in named:
            zp = zero_param_of(p)
            if zp is None:
                out[name] = p.detach()
            elif zp.on_nvme:  # offload_param nvme: the shard is read back from disk
                out[name] = zp.partitioner.swapper.read(zp)
            else:
                out[name] = zp.shard.detach()
        return out

    def load_module(
        self,
        saved: SavedWeights,
        strict: bool,
        custom_load_fn: Optional[Callable],
        with_optimizer: bool,
    ) -> None:
        """Buffers from this rank's file; trained params from the optimizer partitions when
        those are loaded next (else from the consolidated fp32 weights); frozen params from
        this rank's file, or re-cut from every rank's when the world size changed, or (a
        checkpoint with whole weights, stages 1/2) from its whole weights."""
        self._load_buffers(saved, strict)
        if custom_load_fn is not None:
            custom_load_fn(src=saved.consolidated(), dst=self.module)
        elif not with_optimizer:
            self._write_params(saved.consolidated())
        elif not saved.sharded:  # the frozen ones from its whole weights (the optimizer's next)
            params = dict(self.module.named_parameters())
            whole = {
                n: v for n, v in saved.module.items() if n in params and n not in saved.trained
            }
            self._write_params(whole, every=False)
        elif saved.same_world:
            self._load_frozen(saved.frozen_fragments)
        else:
            self._write_params(saved.frozen(), every=False)

    def loaded_without_optimizer(self) -> None:
        """Nothing: the partitioner's shard writes already told the optimizer."""

    def publish_loaded(self, with_optimizer: bool) -> None:
        """The weights, with or without an optimizer: gathered copies from the new shards."""
        if self.runtime is not None:
            self.runtime.publish_loaded()

    # --- the shards ------------------------------------------------------------------------------
    def _load_buffers(self, saved: SavedWeights, strict: bool) -> None:
        buffers = {n: b for n, b in self.module.named_buffers()}
        for name in saved.buffer_names:
            if name in buffers and name in saved.module:
                with torch.no_grad():
                    buffers[name].copy_(saved.module[name])
        if strict:
            expected, got = set(self.module.state_dict().keys()), set(saved.module)
            missing, unexpected = sorted(expected - got), sorted(got - expected)
            if missing or unexpected:
                raise RuntimeError(
                    f"load_checkpoint: the checkpoint's module state does not match the model "
                    f"(missing keys {missing}, unexpected keys {unexpected}); pass "
                    f"load_module_strict=False to load what matches"
                )

    def _write_params(self, full: Dict[str, torch.Tensor], every: bool = True) -> None:
        """The shards of the params in `full` (whole fp32 values); with `every`, a param it
        lacks is reported. Persistent params are re-gathered by publish_loaded."""
        missing = []
        for name, p in self.module.named_parameters():
            zp = zero_param_of(p)
            if name not in full:
                missing.append(name)
                continue
            value = full[name].reshape(-1)
            if zp is None:
                with torch.no_grad():
                    p.copy_(value.view_as(p))
            else:
                zp.partitioner.write_shard(zp, value.to(device=zp.device, dtype=zp.dtype))
        if missing and every:
            logger.warning(
                "load_checkpoint: no saved values for %s; they keep their weights", missing
            )

    def _load_frozen(self, fragments: Dict[str, torch.Tensor]) -> None:
        """This rank's shards of the frozen params (same world size: its own file's)."""
        params = dict(self.module.named_parameters())
        for name, fragment in fragments.items():
            zp = zero_param_of(params[name]) if name in params else None
            if zp is None:
                continue
            values = fragment.reshape(-1)
            with torch.no_grad():
                if zp.on_nvme:
                    zp.partitioner.swapper.write(zp, values.to(zp.dtype))
                else:
                    zp.shard.copy_(values)
            zp.partitioner.shard_modified(zp)

"""ZeRO stages 1 and 2: fp32 master params and optimizer states partitioned over the
data-parallel ranks; each rank steps its partition; updated params are all-gathered.

Where the fp32 state lives (device, host arena, NVMe) is zero/sharded.py's. DeepSpeed treats
offload_optimizer "nvme" as "cpu" at stages 1/2; zerostream honours it.

Stage 1 accumulates gradients locally in a flat buffer and reduce-scatters it once per
optimizer step. Stage 2 reduces gradients bucket by bucket during backward (as soon as
`reduce_bucket_size` elements are ready) and keeps only this rank's partition, so no rank
holds a full gradient.
"""

from __future__ import annotations

import time
from typing import Dict, List, Tuple

import torch

from .. import comm
from ..accelerator import is_host_run
from ..ops.muon import MuonWithAuxAdam
from .flat import FlatGroup, ParamSlot
from .grad_reduce import Stage1Reducer, Stage2Reducer
from .muon_partition import bind_flat_groups
from .protocol import PartitionLayout, StageContext
from .sharded import ShardedOptimizerBase

_REDUCERS = {1: Stage1Reducer, 2: Stage2Reducer}


class UnusedParametersError(AssertionError):
    """zero_optimization.ignore_unused_parameters false, and a backward left trainable params
    without a gradient. An AssertionError, as DeepSpeed's (its tests catch that type)."""


class PartitionedOptimizer(ShardedOptimizerBase):
    """Stages 1 and 2 (the stage picks the gradient reducer, zero/grad_reduce.py)."""

    ignores_round_robin = True  # partitions follow flat parameter order

    def __init__(
        self, ctx: StageContext, param_groups: List[dict], make_optimizer, make_swapped=None
    ):
        zero = ctx.config.zero_optimization
        self.stage = zero.stage
        self.world, self.rank, self.group = ctx.world, ctx.rank, ctx.group
        self.allgather_bucket_size = zero.allgather_bucket_size
        host_run = is_host_run(ctx.device)
        self.flat_groups = [
            FlatGroup(g["params"], self.world, self.rank, host_run) for g in param_groups
        ]
        options = [{k: v for k, v in g.items() if k != "params"} for g in param_groups]
        self._init_state(
            ctx,
            self.local_partitions(),
            options,
            [f.param_starts() for f in self.flat_groups],
            make_optimizer,
            make_swapped,
        )
        if isinstance(self.optimizer, MuonWithAuxAdam):
            bind_flat_groups(self.optimizer, self.flat_groups, self.group)
        self.reducer = _REDUCERS[self.stage](self.flat_groups, self.grads, ctx, self.copy_stage)
        self._keep_device_tier_grads(self.reducer.landing)
        self._slot_of: Dict[torch.nn.Parameter, Tuple[int, ParamSlot]] = {}
        for gi, flat in enumerate(self.flat_groups):
            for slot in flat.slots:
                self._slot_of[slot.param] = (gi, slot)
        self._hooks = [
            s.param.register_post_accumulate_grad_hook(self._on_grad)
            for f in self.flat_groups
            for s in f.slots
        ]
        # ignore_unused_parameters false: every trainable param must get a gradient in every
        # backward (DeepSpeed checks it at stages 1 and 2); the ones that did, this backward.
        self.require_all_grads = not zero.ignore_unused_parameters
        self._got_grad: set = set()

    def local_partitions(self) -> List[torch.Tensor]:
        return [f.partition() for f in self.flat_groups]

    # --- backward --------------------------------------------------------------------------------
    def _on_grad(self, param: torch.nn.Parameter) -> None:
        """Autograd hook: hands the fresh gradient from param.grad to the reducer."""
        self.grad_hook_entered()
        if self.require_all_grads:
            self._got_grad.add(id(param))
        if self.coalescing and self.stage == 2:
            self.hold_coalesced(param)  # reduced when the block ends (Note [Coalesced reduction])
            return
        gi, slot = self._slot_of[param]
        grad = param.grad.detach().reshape(-1)
        param.grad = None
        self.reducer.on_grad(gi, slot, grad)

    def flush_coalesced(self) -> None:
        if self.stage != 2:
            return  # stage 1 reduces at the step
        accum = self.ctx.grad_accum_dtype
        for gi, flat in enumerate(self.flat_groups):
            for slot in flat.slots:
                grad = self.take_coalesced(slot.param)
                if grad is None:  # the same buckets on every rank
                    grad = torch.zeros(slot.numel, dtype=accum, device=slot.param.device)
                self.reducer.on_grad(gi, slot, grad.detach().reshape(-1))
        self.reducer.after_backward()

    def drop_coalesced(self) -> None:
        if self.stage == 2:
            for flat in self.flat_groups:
                for slot in flat.slots:
                    slot.param.grad = None

    def after_backward(self) -> None:
        if not (self.coalescing and self.stage == 2):  # the block's end reduces them
            self.reducer.after_backward()
        if self.require_all_grads:
            self._check_all_grads()

    def _check_all_grads(self) -> None:
        """ignore_unused_parameters false: every rank learns which params some rank left
        without a gradient (one all-reduce of a flag per param, the highest such rank), so
        every rank raises the same error instead of one rank raising while the others wait
        in the next collective."""
        got, self._got_grad = self._got_grad, set()
        slots = [
            (gi, i, s) for gi, flat in enumerate(self.flat_groups) for i, s in enumerate(flat.slots)
        ]
        flags = torch.tensor(
            [0 if id(s.param) in got else self.rank + 1 for _, _, s in slots], dtype=torch.int32
        )
        if self.world > 1:
            flags = flags.to(self.ctx.device)
            comm.all_reduce(flags, op=comm.ReduceOp.MAX, group=self.group)
            flags = flags.cpu()
        missing = [
            f"param {i} of group {gi} {tuple(s.param.shape)} (rank {int(f) - 1})"
            for (gi, i, s), f in zip(slots, flags.tolist())
            if f
        ]
        if missing:
            shown = ", ".join(missing[:5]) + (
                f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            )
            raise UnusedParametersError(
                f"ZeRO stage {self.stage}: {len(missing)} trainable parameter(s) got no "
                f"gradient in this backward on some rank ({shown}): the loss does not depend "
                f"on them there. Set zero_optimization.ignore_unused_parameters to true "
                f"(DeepSpeed's default) to train without them (a missing gradient counts as "
                f"zero), or freeze them (requires_grad=False)."
            )

    # --- step ------------------------------------------------------------------------------------
    def step(self) -> bool:
        """Averages over ranks, unscales, clips, steps this rank's partition and all-gathers the
        updated params. Returns False (and skips) on overflow."""
        with self.telemetry.phase("reduce"):
            self.reducer.at_boundary()
        applied = self._average_and_update()
        if applied:
            self._publish()
        self.zero_grad()
        return applied

    def _publish(self) -> None:
        """Every rank's copy of every group from the updated partitions."""
        if self.world > 1:
            for flat in self.flat_groups:
                self._all_gather(flat)

    def _all_gather(self, flat: FlatGroup) -> None:
        """Rebuilds every rank's copy of the group from the updated partitions, in pieces of at
        most allgather_bucket_size elements per rank so the staging buffer stays bounded."""
        part = flat.partition_numel
        piece = min(part, self.allgather_bucket_size)
        start = time.perf_counter()
        if piece == part:
            comm.all_gather_into_tensor(flat.buffer, flat.partition(), group=self.group)
        else:
            staging = torch.empty(
                self.world * piece, dtype=flat.buffer.dtype, device=flat.buffer.device
            )
            rows = flat.buffer.view(self.world, part)
            for lo in range(0, part, piece):
                n = min(piece, part - lo)
                out = staging[: self.world * n]
                comm.all_gather_into_tensor(out, flat.partition()[lo : lo + n], group=self.group)
                rows[:, lo : lo + n].copy_(out.view(self.world, n))
        self._comm("all_gather", flat.buffer, time.perf_counter() - start)

    def offloadable_states(self) -> dict:
        """Beside the shared states: the flat buffers every parameter is a view of, and stage
        1's not-yet-reduced gradients (zero/state_offload.py)."""
        from .grad_reduce import Stage1Reducer
        from .state_offload import OffloadStateType as K
        from .state_offload import StateGroup

        def repoint() -> None:
            for f in self.flat_groups:
                for s in f.slots:
                    s.param.data = f.buffer[s.offset : s.offset + s.numel].view_as(s.param)

        groups = super().offloadable_states()
        groups[K.lp_params] = StateGroup([f.buffer for f in self.flat_groups], repoint)
        if isinstance(self.reducer, Stage1Reducer):
            groups[K.contiguous_grad_buffer] = StateGroup(list(self.reducer.local))
        return groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.settle_update()  # pieces updated during a backward no step() followed go back
        self.holding_grads = False
        self._zero_partition_grads()
        for f in self.flat_groups:
            for s in f.slots:
                s.param.grad = None

    @property
    def bit16_groups(self) -> List[List[torch.nn.Parameter]]:
        return [[s.param for s in f.slots] for f in self.flat_groups]

    # DeepSpeed's names for where a parameter lies, read by its tests (plain data): a param's
    # id is its position over all groups, and the ranks owning a piece of it are its
    # partition ids.
    def get_param_id(self, param: torch.nn.Parameter) -> int:
        ids = {id(s.param): i for i, s in enumerate(s for f in self.flat_groups for s in f.slots)}
        if id(param) not in ids:
            raise ValueError(f"a parameter of shape {tuple(param.shape)} is not trained here")
        return ids[id(param)]

    @property
    def param_to_partition_ids(self) -> List[Dict[int, List[int]]]:
        out, first = [], 0
        for flat in self.flat_groups:
            out.append({first + i: list(flat.owners(s)) for i, s in enumerate(flat.slots)})
            first += len(flat.slots)
        return out

    # --- checkpoint state and inspection ---------------------------------------------------------
    def state_dict(self, streamed: bool = False) -> dict:
        """This rank's optimizer state in DeepSpeed's stage 1/2 layout (reference §3.3):
        `single_partition_of_fp32_groups` holds the fp32 partitions without the alignment
        padding, which is what zero_to_fp32 concatenates over ranks."""
        masters = self._fp32_partitions(streamed)
        return {
            "zero_stage": self.stage,
            **self._scaler_state(),
            "base_optimizer_state": self._inner_state_dict(streamed),
            "single_partition_of_fp32_groups": [
                m[: f.partition_valid] for m, f in zip(masters, self.flat_groups)
            ],
            "partition_count": [self.world] * len(self.flat_groups),
            "group_paddings": [f.partition_numel - f.partition_valid for f in self.flat_groups],
        }

    def load_state_dict(self, state: dict, publish: bool = True) -> None:
        self._check_loadable(state, (1, 2))
        self._load_partitions(
            state["single_partition_of_fp32_groups"], state["base_optimizer_state"]
        )
        self._load_scaler_state(state)
        if publish:
            self.publish_loaded()

    def publish_loaded(self) -> None:
        """Every rank's whole 16-bit weights from the partitions just loaded (all-gather)."""
        self._publish()

    def partition_layout(self) -> PartitionLayout:
        """A group's partition is this rank's slice of the flat group (zero/flat.py), the
        params' pieces consecutive in it."""
        pieces = []
        for flat in self.flat_groups:
            owned = []
            for i, slot in enumerate(flat.slots):
                lo, hi = flat.overlap(slot)
                if hi > lo:
                    owned.append((i, lo, hi, slot.offset + lo - flat.partition_begin))
            pieces.append(owned)
        return self._layout(pieces, partition_count=[self.world] * len(self.flat_groups))

    def state_summary(self) -> dict:
        """Where this rank's state lives and what its reducer did (plain data)."""
        return {
            **self._state_summary(),
            "groups": [
                {
                    "numel": f.numel,
                    "partition_begin": f.partition_begin,
                    "partition_numel": f.partition_numel,
                    "partition_valid": f.partition_valid,
                }
                for f in self.flat_groups
            ],
            "full_grads_left": sum(
                1 for f in self.flat_groups for s in f.slots if s.param.grad is not None
            ),
            **self.reducer.summary(),
        }

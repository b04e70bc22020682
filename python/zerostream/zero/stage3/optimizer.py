"""ZeRO stage 3: parameters, gradients and optimizer state all partitioned.

prepare_module partitions the module's parameters (those zero.Init has not already) and
hooks its modules to a coordinator (coordinator.py) that gathers parameters around each
module's forward and backward. The optimizer holds, per param group, this rank's shards of
the group's parameters concatenated into one flat 16-bit partition (the params' `ds_tensor`
become views of it), steps fp32 masters of it where zero/sharded.py places them, and writes
the result back into the shards; the next forward gathers the updated values. Gradients are
reduce-scattered into the fp32 gradient partition as autograd finishes them (reduce.py), so
no full gradient outlives its bucket.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from ... import comm
from ...offload import sinks
from ...offload.copy_stage import CopyMeter
from ...ops.muon import MuonWithAuxAdam
from ..base import place_buffers
from ..muon_partition import bind_shard_groups
from ..protocol import PartitionLayout, StageCheckpoint, StageContext
from ..sharded import ShardedOptimizerBase
from . import hooks, leaf
from .checkpoint import Stage3Checkpoint
from .consolidate import consolidated_state_dict
from .coordinator import ParamCoordinator, module_params
from .module_state import ensure_state, runtime_of, state_of
from .param import ShardHome, ShardState, ZeroParam, zero_param_of
from .param_swap import ParamSwapper, ShardSink
from .partitioner import Partitioner
from .reduce import Stage3Reducer


class Stage3Runtime:
    """The partitioner, coordinator and module hooks of one module tree."""

    def __init__(self, root: torch.nn.Module, part: Partitioner, coord: ParamCoordinator):
        self.root, self.part, self.coord = root, part, coord
        # Leaf modules' descendants get no hooks (Note [Leaf modules] in leaf.py).
        self.hooked = list(leaf.hooked_modules(root))
        for m in self.hooked:
            if leaf.is_leaf(m):
                for p in m.parameters():
                    p.ds_z3_leaf_module = m  # DeepSpeed's mark (utils.z3_leaf_parameter)
        self.handles = hooks.install(self.hooked, coord)
        ensure_state(root).runtime = self

    def publish_loaded(self) -> None:
        """After a load rewrote the shards: nothing stays gathered from before it, and the
        persistent params' gathered copies are re-gathered from the new shards."""
        self.part.release_all()
        self.part.refresh_gathered()

    def close(self) -> None:
        """Nothing left gathered or uploading, the hooks removed, the param swap files gone."""
        self.part.release_all()
        self.part.settle_uploads()
        hooks.remove(self.hooked, self.handles)
        self.handles = []
        ensure_state(self.root).runtime = None
        if self.part.swapper is not None:
            self.part.swapper.close()


def _adopt_init_params(module: torch.nn.Module, part: Partitioner, ctx: StageContext) -> None:
    """Takes over params zero.Init partitioned: same group size required; their Init-time
    hooks give way to the engine's."""
    for m in module.modules():
        state = state_of(m)
        if state is not None:
            for h in state.init_hooks:
                h.remove()
            state.init_hooks = []
    for name, p in module.named_parameters():
        zp = zero_param_of(p)
        if zp is None:
            continue
        if zp.world != part.world or zp.rank != part.rank:
            raise ValueError(
                f"parameter {name} was partitioned by zero.Init over {zp.world} ranks "
                f"(this is rank {zp.rank}); the engine's data-parallel group has "
                f"{part.world} (rank {part.rank})"
            )
        if ctx.dtype != zp.dtype and p.is_floating_point():
            raise ValueError(
                f"parameter {name} was built by zero.Init in {zp.dtype}; the config trains "
                f"in {ctx.dtype} (give zero.Init the same config, or the matching dtype=)"
            )
        if zp.state is ShardState.GATHERED and not zp.persist:
            zp.to_sharded()  # Init-time gathers are not counted by this partitioner
        zp.modules = 0
        _move_shard(zp, part)
        zp.partitioner = part
        part.params[zp.ds_id] = zp


def _move_shard(zp: ZeroParam, part: Partitioner) -> None:
    """Puts an adopted param's shard where this run's offload_param says."""
    source = zp.partitioner.swapper if zp.partitioner is not None else None
    if zp.on_nvme and source is not part.swapper:
        zp.move_shard(part.new_shard_home(), source.read(zp).to(part.shard_device()))
    elif not zp.on_nvme:
        on_device = zp.home is ShardHome.DEVICE
        if on_device != (part.new_shard_home() is ShardHome.DEVICE):  # offload_param changed
            zp.move_shard(part.new_shard_home(), zp.shard.to(part.shard_device()))
    if not zp.on_nvme and part.swapper is not None and not zp.persist:
        part.swapper.home(zp, zp.shard)


def _swapper_for(module: torch.nn.Module, ctx: StageContext) -> Optional[ParamSwapper]:
    """offload_param nvme: the swapper zero.Init already keeps this model's shards in (same
    nvme_path), else a new one."""
    zero = ctx.config.zero_optimization
    if zero.offload_param_device != "nvme":
        return None
    for p in module.parameters():
        zp = zero_param_of(p)
        swapper = zp.partitioner.swapper if zp is not None and zp.partitioner else None
        if swapper is not None and swapper.path == zero.offload_param.nvme_path:
            return swapper
    from ...offload.io_engine import io_config_for

    swapper = ParamSwapper(
        zero.offload_param,
        io_config_for(ctx.config.aio),
        rank=comm.get_rank(),
        verify_checksums=ctx.config.zerostream.verify_swap_checksums,
    )
    try:
        swapper.require_space(
            [p for p in module.parameters() if zero_param_of(p) is None],
            ctx.world,
            zero.stage3_param_persistence_threshold,
        )
    except OSError:
        swapper.store.close()
        raise
    return swapper


class Stage3Optimizer(ShardedOptimizerBase):
    """Stage 3 (Note [Stage seam] in zero/protocol.py)."""

    stage = 3

    @classmethod
    def prepare_module(cls, module: torch.nn.Module, ctx: StageContext) -> None:
        zero = ctx.config.zero_optimization
        offload = zero.offload_param if zero.offload_param_device != "none" else None
        swapper = _swapper_for(module, ctx)
        part = Partitioner(
            ctx.group,
            ctx.device,
            ctx.dtype,
            offload_param=offload,
            persistence_threshold=zero.stage3_param_persistence_threshold,
            model_persistence_threshold=zero.stage3_model_persistence_threshold,
            world=ctx.world,
            rank=ctx.rank,
            swapper=swapper,
            sanity_checks=zero.enable_sanity_checks,
        )
        leaf.apply_config(module, leaf.leaf_config(zero.leaf_module))
        _adopt_init_params(module, part, ctx)
        part.partition(module.parameters())
        place_buffers(module, ctx)
        ctx.module_state = Stage3Runtime(module, part, ParamCoordinator(part, zero, run=ctx.run))

    gathers_to_save = True

    @classmethod
    def whole_16bit_weights(cls, module: torch.nn.Module, exclude_frozen: bool = False):
        """Every parameter gathered in turn and copied to host memory on rank 0 (consolidate.py)."""
        return consolidated_state_dict(module, exclude_frozen_parameters=exclude_frozen)

    @classmethod
    def release_gathered(cls, module: torch.nn.Module) -> None:
        """Every param empty, the persistent ones included, as DeepSpeed's
        empty_partition_cache leaves them; the next forward gathers what it uses."""
        runtime = runtime_of(module)
        if runtime is not None:
            runtime.part.release_all(persistent=True)

    @classmethod
    def close(cls, module: torch.nn.Module, optimizer) -> None:
        """Copies in flight finish, the module hooks go (params stay partitioned), and the
        swap files of the params and of the optimizer state are deleted."""
        runtime = runtime_of(module)
        if optimizer is not None and optimizer.copy_stage is not None:
            optimizer.copy_stage.drain()
        if runtime is not None:
            runtime.close()
        if optimizer is not None:
            optimizer.close_state()

    @classmethod
    def checkpointer(cls, module: torch.nn.Module, optimizer) -> StageCheckpoint:
        """Sharded weights (zero/stage3/checkpoint.py), with or without an optimizer."""
        return Stage3Checkpoint(module, runtime_of(module), optimizer)

    def __init__(
        self, ctx: StageContext, param_groups: List[dict], make_optimizer, make_swapped=None
    ):
        zero = ctx.config.zero_optimization
        self.world, self.rank, self.group = ctx.world, ctx.rank, ctx.group
        self.runtime: Stage3Runtime = ctx.module_state
        self.part, self.coord = self.runtime.part, self.runtime.coord
        self.groups: List[List[ZeroParam]] = []
        self.flat16: List[torch.Tensor] = []
        slots: Dict[int, Tuple[int, int]] = {}
        starts = []
        for gi, g in enumerate(param_groups):
            zps = [self._zero_param(p) for p in g["params"]]
            total = sum(zp.shard_numel for zp in zps)
            if self.part.swapper is not None:
                flat = ShardSink(zps, self.part.swapper)  # shards stay in the swap store
            else:
                flat = self.part.empty_partition(total, zps[0].dtype)
                self.part.adopt(zps, flat)
            off, group_starts = 0, []
            for zp in zps:
                slots[zp.ds_id] = (gi, off)
                group_starts.append(off)
                off += zp.shard_numel
            self.groups.append(zps)
            self.flat16.append(flat)
            starts.append(group_starts)
        options = [{k: v for k, v in g.items() if k != "params"} for g in param_groups]
        host = self.part.offload_device != "none"
        self._init_state(ctx, self.flat16, options, starts, make_optimizer, make_swapped, host)
        if isinstance(self.optimizer, MuonWithAuxAdam):
            bind_shard_groups(
                self.optimizer, self.groups, self.world, self.rank, self.group, ctx.device
            )
        self.slots = slots
        if self.part.swapper is not None:
            # The shards on disk are placed by this stage's placer (and counted in the
            # optimizer's step prediction) from now on.
            self.part.swapper.join(self.placement)
        if self.swapper is not None:
            # Its device tier's "auto" sizes from a step that ran the trace's plan.
            self.swapper.device_auto.step_planned = self.coord.step_is_planned
        self.reducer = Stage3Reducer(
            slots,
            {zp.ds_id: zp for zps in self.groups for zp in zps},
            self.grads,
            zero.reduce_bucket_size,
            ctx,
            self.copy_stage,
        )
        self._keep_device_tier_grads(self.reducer.landing)
        if self.world > 1:
            # Gathers and reduce-scatters share the group: their interleaving is one
            # sequence every rank agrees on (Note [One gather sequence on every rank]).
            self.reducer.sequencer = self.coord
            self.coord.reducer = self.reducer
        self._hooks = [
            zp.param.register_post_accumulate_grad_hook(self._on_grad)
            for zps in self.groups
            for zp in zps
        ]
        leaves = [m for m in self.runtime.hooked if leaf.is_leaf(m)]
        self.leaf_grads = None
        if leaves:
            self.leaf_grads = self.coord.leaf_grads = leaf.LeafGrads(
                leaves, module_params, set(slots), self.reducer.add, self.coord.after_grad
            )
        self.part.shard_listeners.append(self._on_shard_modified)
        self.part.telemetry = ctx.telemetry
        if self.part.swapper is not None:
            self.part.swapper.telemetry = ctx.telemetry
        # The shards' uploads before each gather (offload_param cpu/nvme): the PCIe link.
        self._upload_meter = (
            CopyMeter(self.part.uploads, ctx.telemetry) if self.part.uploads is not None else None
        )
        if self.behind is not None:  # each gather waits for the update of its shards
            self.part.before_shard_access = self._await_shards
            if self.part.swapper is not None:  # "auto" moves shards the update may write
                self.part.swapper.before_move = self.settle_update

    @staticmethod
    def _zero_param(p: torch.nn.Parameter) -> ZeroParam:
        zp = zero_param_of(p)
        if zp is None:
            raise ValueError(
                f"ZeRO-3: optimizer parameter of shape {tuple(p.shape)} is not part of the "
                f"model given to initialize() (stage 3 partitions the model's parameters)"
            )
        return zp

    def local_partitions(self) -> List[torch.Tensor]:
        return self.flat16

    def offloadable_states(self) -> dict:
        """Beside the shared states: the flat shard partitions every `ds_tensor` is a view of,
        the shards of params no group holds (frozen ones) and the full copies of persistent
        params (zero/state_offload.py). With offload_param the shards live where it keeps
        them (host memory, or NVMe, where a group's partition is a ShardSink, no tensor), so
        only the persistent params' full copies, on the device, are parked."""
        from ..state_offload import OffloadStateType as K
        from ..state_offload import StateGroup

        shards_here = self.part.offload_device == "none"
        grouped = {zp.ds_id for zps in self.groups for zp in zps}
        loose = [zp for zp in self.part.params.values() if zp.ds_id not in grouped]
        persistent = [zp for zp in self.part.params.values() if zp.persist and zp._full is not None]
        if not shards_here:
            loose = []

        def repoint() -> None:
            for flat, zps in zip(self.flat16 if shards_here else [], self.groups):
                off = 0
                for zp in zps:
                    zp.repoint(flat[off : off + zp.shard_numel])
                    off += zp.shard_numel
            for zp in loose:
                zp.repoint(None)  # its shard tensor itself moved
            for zp in persistent:
                zp.repoint(None)

        groups = super().offloadable_states()
        tensors = list(self.flat16) if shards_here else []
        tensors += [zp.shard for zp in loose if zp.shard is not None]
        tensors += [zp._full for zp in persistent]
        groups[K.lp_params] = StateGroup(tensors, repoint)
        return groups

    # --- the step's phases -----------------------------------------------------------------------
    def before_forward(self) -> None:
        super().before_forward()
        self.coord.start_step((torch.is_grad_enabled(), self.runtime.root.training))

    def after_forward(self) -> None:
        if not torch.is_grad_enabled():
            self.part.release_all()  # no backward follows: nothing stays gathered

    def _on_grad(self, param: torch.nn.Parameter) -> None:
        """Autograd hook: the param's gradient is final for this backward."""
        self.grad_hook_entered()
        zp = param._zs
        if self.coalescing:
            # The whole gradient stays until the block ends; the param itself is released
            # as usual (Note [Coalesced reduction] in zero/base.py).
            self.hold_coalesced(param)
            self.coord.after_grad(zp)
            return
        grad = param.grad
        param.grad = None
        if self.leaf_grads is not None and self.leaf_grads.owns(zp):
            self.leaf_grads.hold(zp, grad)  # handed on when its leaf's backward is done
            return
        self.reducer.add(zp, grad)
        self.coord.after_grad(zp)

    def after_backward(self) -> None:
        if self.leaf_grads is not None and not self.coalescing:
            self.leaf_grads.finish()
        # The gathers' pass ends first (autograd's callback did, on a rank whose backward
        # reached a hook), then the buckets left: every rank in that order.
        self.coord.end_backward()
        if not self.coalescing:  # the block's end reduces its gradients, once
            self.reducer.end_backward()
        self.reducer.drain()

    def begin_coalescing(self) -> None:
        super().begin_coalescing()
        self.coord.leaf_grads = None  # a leaf's gradients stay on param.grad too

    def flush_coalesced(self) -> None:
        self.coord.leaf_grads = self.leaf_grads
        for zps in self.groups:
            for zp in zps:
                grad = self.take_coalesced(zp.param)
                if grad is None:  # the same buckets on every rank
                    grad = torch.zeros(zp.numel, dtype=self.ctx.grad_accum_dtype, device=zp.device)
                self.reducer.add(zp, grad)
        self.reducer.flush()
        self.reducer.drain()

    def drop_coalesced(self) -> None:
        self.coord.leaf_grads = self.leaf_grads
        for zps in self.groups:
            for zp in zps:
                zp.param.grad = None

    def step(self) -> bool:
        # A step() with no backward since an overlapped one; the pieces updated during the
        # backward stay for _average_and_update to judge.
        self.settle_update(keep_speculation=True)
        with self.telemetry.phase("reduce"):
            if self.leaf_grads is not None:  # a plain loss.backward() ran no after_backward
                self.leaf_grads.finish()
            self.reducer.flush()
            self.reducer.drain()
        # With the update behind the next forward, the persistent params are released too:
        # the next forward's start gathers them again, on every rank, from the shards the
        # update writes first (Note [The step overlapped with the next forward]).
        self.part.release_all(persistent=self.behind is not None)
        self.part.settle_uploads()  # the update rewrites host shards the uploads read
        if self._upload_meter is not None:
            self._upload_meter.count()
        applied = self._average_and_update()
        if self.behind is not None and self.behind.running:
            self._drop_param_grads()  # the update zeroes the partitions once it read them
            return applied
        if applied:
            self.part.refresh_gathered(only=self.slots)  # the params this optimizer updates
        self.zero_grad()
        return applied

    def _behind_pieces(self, partitions: list) -> list:
        """The update's pieces: each persistent param's shard first (the next forward's
        start gathers them), then the other shards in partition order, consecutive small
        ones merged, none over the copy stage's slot (zero/overlap.py's plan_pieces)."""
        from ..overlap import plan_pieces

        layout = [
            [(off, zp.shard_numel, zp.persist) for zp, off in zip(zps, starts)]
            for zps, starts in zip(self.groups, self._starts())
        ]
        caps = [sinks.piece(p, 1 << 22) for p in partitions]
        return plan_pieces(layout, [sinks.numel(p) for p in partitions], caps)

    def _early_ranges(self) -> list:
        """The persistent params' shards (group, lo, hi): the update behind the next forward
        writes them first (the next forward's start gathers them)."""
        return [
            (g, off, off + zp.shard_numel)
            for g, (zps, starts) in enumerate(zip(self.groups, self._starts()))
            for zp, off in zip(zps, starts)
            if zp.persist and zp.shard_numel > 0
        ]

    def _starts(self) -> List[List[int]]:
        """Each group's params' shard offsets in its partition."""
        return [[self.slots[zp.ds_id][1] for zp in zps] for zps in self.groups]

    def _await_shards(self, zps) -> None:
        """Before a gather reads (or a write replaces) these shards: the update's pieces that
        write them are done, on the host and, for their uploads, on the compute stream."""
        behind = self.behind
        if not behind.running:
            return
        marks = {}
        for zp in zps:
            slot = self.slots.get(zp.ds_id)
            if slot is not None:
                group, at = slot
                for mark in behind.wait_range(group, at, at + zp.shard_numel):
                    marks[id(mark)] = mark
        for mark in marks.values():
            self.copy_stage.wait_mark(mark)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.settle_update()
        self._zero_partition_grads()
        self._drop_param_grads()

    def _drop_param_grads(self) -> None:
        self.holding_grads = False
        for zps in self.groups:
            for zp in zps:
                zp.param.grad = None

    def close_state(self) -> None:
        """Also stops listening to the partitioner: the module's params keep it (and a
        caller often keeps the module after engine.destroy()), and through its listener it
        kept this optimizer alive, host arenas and all."""
        super().close_state()
        if self._on_shard_modified in self.part.shard_listeners:
            self.part.shard_listeners.remove(self._on_shard_modified)
        if self.part.before_shard_access == self._await_shards:
            self.part.before_shard_access = None
        if self.part.swapper is not None and self.part.swapper.before_move == self.settle_update:
            self.part.swapper.before_move = None

    def _on_shard_modified(self, zp: ZeroParam) -> None:
        """GatheredParameters rewrote a shard: the fp32 master follows it."""
        self.settle_update()
        slot = self.slots.get(zp.ds_id)
        if slot is None:
            return
        group, at = slot
        values = self.part.swapper.read(zp) if zp.on_nvme else zp.shard
        with torch.no_grad():
            if self.swapper is not None:  # fp32 masters on NVMe
                self.swapper.state_access.write_state(group, at, values.float())
            else:
                self.masters[group][at : at + zp.shard_numel].copy_(values)

    @property
    def bit16_groups(self) -> List[List[torch.nn.Parameter]]:
        return [[zp.param for zp in zps] for zps in self.groups]

    @property
    def fp16_groups(self) -> List[List[torch.nn.Parameter]]:
        """DeepSpeed's stage-3 name for the parameters of each group (DeepSpeed lists one
        per sub-group of sub_group_size elements; zerostream's groups are the param groups,
        what DeepSpeed's default sub_group_size of 1e9 gives for models below that)."""
        return self.bit16_groups

    # --- checkpoint state and inspection ---------------------------------------------------------
    def state_dict(self, streamed: bool = False) -> dict:
        """This rank's optimizer state in DeepSpeed's stage-3 layout (reference §3.3): per
        group, the fp32 flat partition of its params' shards, each ceil(numel/world)
        elements, concatenated in `param_shapes` order."""
        return {
            "zero_stage": 3,
            **self._scaler_state(),
            "optimizer_state_dict": self._inner_state_dict(streamed),
            "fp32_flat_groups": self._fp32_partitions(streamed),
            "partition_count": self.world,
        }

    def load_state_dict(self, state: dict, publish: bool = True) -> None:
        self._check_loadable(state, (3,))
        self.part.settle_uploads()
        self._load_partitions(state["fp32_flat_groups"], state["optimizer_state_dict"])
        self._load_scaler_state(state)
        if publish:
            self.publish_loaded()

    def publish_loaded(self) -> None:
        """Gathered copies (persistent params) re-gathered from the loaded shards."""
        self.runtime.publish_loaded()

    def partition_layout(self) -> PartitionLayout:
        """A group's partition is its params' shards, ceil(numel/world) elements each (the
        last rank's padded), concatenated in group order."""
        pieces = []
        for zps in self.groups:
            owned, at = [], 0
            for i, zp in enumerate(zps):
                first = zp.rank * zp.shard_numel
                if zp.shard_valid > 0:
                    owned.append((i, first, first + zp.shard_valid, at))
                at += zp.shard_numel
            pieces.append(owned)
        return self._layout(pieces, partition_count=self.world)

    def state_summary(self) -> dict:
        return {
            **self._state_summary(),
            "groups": [
                {"params": len(zps), "partition_numel": sum(zp.shard_numel for zp in zps)}
                for zps, f in zip(self.groups, self.flat16)
            ],
            "full_grads_left": sum(
                1 for zps in self.groups for zp in zps if zp.param.grad is not None
            ),
            "params": self.part.summary(),
            "trace": self.coord.summary(),
            **self.reducer.summary(),
        }

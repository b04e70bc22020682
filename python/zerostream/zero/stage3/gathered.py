"""`zero.GatheredParameters`: the full tensors of ZeRO-3 parameters for the duration of a
context; what `modifier_rank` wrote is broadcast to every rank and re-partitioned on exit."""

from __future__ import annotations

import contextlib
from typing import Dict, List

import torch

from ... import comm
from .module_state import register_external_parameter
from .param import ShardState, ZeroParam, unique_zero_params
from .partitioner import Partitioner


def _zero_params(params) -> List[ZeroParam]:
    if params is None:
        return []
    if isinstance(params, torch.Tensor):
        params = [params]
    return unique_zero_params(params)


class GatheredParameters(contextlib.ContextDecorator):
    """Gathers ZeRO-3 partitioned `params` (one tensor or an iterable; others are ignored, and
    none at all makes it a no-op, as in DeepSpeed). With `modifier_rank` set, that rank's
    values are broadcast on exit and every rank keeps its shard of them; with None, changes
    made inside are dropped. `fwd_module` registers the params as external params of it."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        self.zps = _zero_params(params)
        self.enabled = bool(enabled) and bool(self.zps)
        self.modifier_rank = modifier_rank
        if self.enabled and fwd_module is not None:
            for zp in self.zps:
                register_external_parameter(fwd_module, zp.param)
        self._was: Dict[int, ShardState] = {}
        self._versions: List[tuple] = []

    def _changed_anywhere(self) -> str:
        """With enable_sanity_checks and no modifier: the ds_ids of the params changed in
        place in the block on this rank, or "on another rank", when any rank changed one
        (one MAX all-reduce over the group, so that every rank raises); "" otherwise. The
        check's presence is the config's, the same on every rank."""
        if not self._versions:
            return ""
        mine = [
            zp.ds_id
            for zp, ptr, version in self._versions
            if zp.param.data_ptr() != ptr or zp.param._version != version
        ]
        part = self._partitioner(self._versions[0][0])
        anywhere = bool(mine)
        if part.world > 1:
            # On the group's host twin where it has one (Note [Agreements on the host] in
            # comm/): the flag is the host's and needs no device round trip.
            host = comm.host_group(part.group)
            flag = torch.tensor(
                [int(anywhere)], dtype=torch.int32, device="cpu" if host else part.device
            )
            comm.all_reduce(flag, op=comm.ReduceOp.MAX, group=host or part.group)
            anywhere = bool(flag.item())
        if not anywhere:
            return ""
        return f"ds_id {', '.join(map(str, mine))}" if mine else "on another rank"

    def _partitioner(self, zp: ZeroParam) -> Partitioner:
        part = getattr(zp, "partitioner", None)
        if part is None:
            raise RuntimeError(f"ZeRO-3 param ds_id={zp.ds_id} has no partitioner")
        return part

    def __enter__(self):
        if not self.enabled:
            return self
        by_part: Dict[int, List[ZeroParam]] = {}
        for zp in self.zps:
            self._was[zp.ds_id] = zp.state
            by_part.setdefault(id(self._partitioner(zp)), []).append(zp)
        for zps in by_part.values():
            # Exactly these params on every rank, whatever each holds already (Note [One
            # gather sequence on every rank] in coordinator.py); persistent ones are here.
            part = self._partitioner(zps[0])
            part.gather_exact(zps)
            part.gather([zp for zp in zps if zp.persist])  # emptied by empty_partition_cache
        for zp in self.zps:
            zp.users += 1
        # enable_sanity_checks: an in-place change without a modifier would be dropped at
        # exit; remembered here (storage and version) to be refused there.
        self._versions = [
            (zp, zp.param.data_ptr(), zp.param._version)
            for zp in self.zps
            if self.modifier_rank is None and self._partitioner(zp).sanity_checks
        ]
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        for zp in self.zps:
            zp.users -= 1
        if self.modifier_rank is not None:
            with torch.no_grad():
                for zp in self.zps:
                    part = self._partitioner(zp)
                    full = zp.full_flat()
                    if part.world > 1:
                        src = comm.get_global_rank(part.group, self.modifier_rank)
                        comm.broadcast(full, src, group=part.group)
                    part.write_shard(zp, full)
        changed = self._changed_anywhere()
        for zp in self.zps:
            if self._was[zp.ds_id] is ShardState.SHARDED:
                # Not in place: what the block took from the full tensor stays valid.
                self._partitioner(zp).release(zp, in_place=False)
        if changed and not exc[0]:
            raise RuntimeError(
                f"GatheredParameters: in-place modification of ZeRO-3 parameters ({changed}) "
                f"inside a block with modifier_rank=None, seen on a rank of the group "
                f"(zero_optimization.enable_sanity_checks): without a modifier the change is "
                f"dropped at exit. Pass modifier_rank=<rank> to keep that rank's values on "
                f"every rank"
            )
        return False

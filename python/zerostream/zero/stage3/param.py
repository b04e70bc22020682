"""One ZeRO-3 parameter: its state machine and where its bytes are.

Note [Stage-3 parameter states]
  A partitioned parameter is SHARDED (only this rank's shard exists; `param.data` is an empty
  tensor, as DeepSpeed leaves it), INFLIGHT (an all-gather into its full buffer was issued
  and has not been waited on) or GATHERED (`param.data` is the full tensor). The full
  tensor is one buffer per parameter whose storage is resized to zero bytes on release and
  back on gather: autograd may have saved views of it during forward (a linear layer saves
  `weight.t()`), and those views share the storage, so releasing really frees the bytes
  and re-gathering before backward makes the saved views valid again (FSDP2 does the same).
  Where the shard lives is its ShardHome, changed only by `move_shard` (Note [Shard
  homes]); the phase of the step is the coordinator's (coordinator.Phase).

Note [Shard homes]
  A shard lives in one of four homes. DEVICE: the run's device (no offload_param; on a
  machine without a GPU the device is host memory, still this home). HOST: pageable host
  memory of its own (offload_param "cpu" or "nvme" with max_in_cpu), until a host partition
  takes it. HOST_ARENA: a slice of a host arena partition (a param group's flat 16-bit
  partition, or one for loose shards), page-locked and registered with the GPU when
  offload_param.pin_memory is set, so its upload before a gather is an asynchronous DMA.
  NVME: only in the swap store (param_swap.py); `shard` is None. The partitioner
  decides the home; `move_shard` checks the move and that the tensor fits it
  (_SHARD_MOVES: a shard never leaves an arena for pageable memory, and reaches a home
  from nowhere only at partitioning).

  DeepSpeed's per-parameter attributes that ecosystem code reads (`ds_id`, `ds_shape`,
  `ds_numel`, `ds_tensor`, `ds_status`, `ds_persist`) are plain data on the parameter,
  refreshed at each transition; the runtime object is `param._zs`.
"""

from __future__ import annotations

import enum
from typing import List, Optional

import torch

from ... import _C


class ShardState(enum.Enum):
    SHARDED = "sharded"
    INFLIGHT = "inflight"
    GATHERED = "gathered"


class ShardHome(enum.Enum):
    """Where a parameter's shard lives (Note [Shard homes])."""

    DEVICE = "device"
    HOST = "host"
    HOST_ARENA = "host_arena"
    NVME = "nvme"


# The homes a shard may move to from each (None: not partitioned yet).
_SHARD_MOVES = {
    None: {ShardHome.DEVICE, ShardHome.HOST, ShardHome.NVME},
    ShardHome.DEVICE: {ShardHome.DEVICE, ShardHome.HOST, ShardHome.NVME},
    ShardHome.HOST: {ShardHome.DEVICE, ShardHome.HOST_ARENA, ShardHome.NVME},
    ShardHome.HOST_ARENA: {ShardHome.DEVICE, ShardHome.HOST_ARENA, ShardHome.NVME},
    ShardHome.NVME: {ShardHome.DEVICE, ShardHome.HOST, ShardHome.HOST_ARENA},
}


class ZeroParamStatus(enum.Enum):
    """DeepSpeed's names for the same states (`param.ds_status`)."""

    AVAILABLE = 1
    NOT_AVAILABLE = 2
    INFLIGHT = 3


_DS_STATUS = {
    ShardState.SHARDED: ZeroParamStatus.NOT_AVAILABLE,
    ShardState.INFLIGHT: ZeroParamStatus.INFLIGHT,
    ShardState.GATHERED: ZeroParamStatus.AVAILABLE,
}


class ZeroParam:
    """Runtime state of one partitioned parameter (Note [Stage-3 parameter states])."""

    def __init__(
        self,
        param: torch.nn.Parameter,
        ds_id: int,
        world: int,
        rank: int,
        device: torch.device,
        group=None,
    ):
        self.param = param
        self.ds_id = ds_id
        self.shape = param.shape
        self.dtype = param.dtype
        self.numel = param.numel()
        self.world, self.rank, self.group = world, rank, group
        self.device = device  # where the full tensor lives while gathered
        self.partitioner = None  # the stage3.partitioner.Partitioner that moves it
        _, self.shard_numel, self.shard_valid = _C.stage3_param_shard(self.numel, world, rank)
        self.shard: Optional[torch.Tensor] = None  # None: not partitioned yet, or on NVMe
        self.home: Optional[ShardHome] = None  # None until the partitioner places the shard
        self.persist = False
        self.users = 0  # modules running forward with this param now
        self.modules = 0  # modules listing it as their own or external param
        self.state = ShardState.SHARDED
        self._full: Optional[torch.Tensor] = None
        self._empty = torch.empty(0, dtype=self.dtype, device=device)
        param.data = self._empty
        # DeepSpeed's per-param calls, for code that gathers by hand.
        param.all_gather = self._all_gather_call
        param.all_gather_coalesced = self._all_gather_coalesced_call
        param.partition = self._partition_call
        self._publish()

    # --- DeepSpeed's param.all_gather() / all_gather_coalesced() / partition() -------------------
    def _zps(self, param_list) -> List["ZeroParam"]:
        return [self] if param_list is None else unique_zero_params(param_list)

    def _all_gather_call(self, param_list=None, async_op: bool = False, hierarchy: int = 0):
        """Gathers the params (this one by default) now; they stay whole until partitioned
        (by `partition`, or by stage 3 when a module that uses them is done)."""
        self.partitioner.gather(self._zps(param_list))
        return _Done()

    def _all_gather_coalesced_call(self, params, safe_mode: bool = False, quantize: bool = False):
        """One all-gather per dtype for `params`; a handle whose wait() returns at once (the
        gather is done when this returns)."""
        self.partitioner.gather(self._zps(params))
        return _Done()

    def _partition_call(self, param_list=None, has_been_updated: bool = False, **_kwargs):
        """Releases the params' whole tensors (in use or persistent ones stay)."""
        for zp in self._zps(param_list):
            self.partitioner.release(zp, in_place=False)

    # --- transitions -----------------------------------------------------------------------------
    def _require(self, *allowed: ShardState, what: str) -> None:
        if self.state not in allowed:
            names = " or ".join(s.value for s in allowed)
            raise RuntimeError(
                f"ZeRO-3 param ds_id={self.ds_id} {tuple(self.shape)}: {what} while "
                f"{self.state.value}; expected {names}"
            )

    def full_flat(self) -> torch.Tensor:
        """The full buffer (1-D), with its storage allocated."""
        nbytes = self.numel * self._empty.element_size()
        if self._full is None:
            self._full = torch.empty(self.numel, dtype=self.dtype, device=self.device)
        elif self._full.untyped_storage().nbytes() != nbytes:
            self._full.untyped_storage().resize_(nbytes)
        return self._full

    def to_inflight(self) -> torch.Tensor:
        """SHARDED -> INFLIGHT: allocates the full buffer the gather writes into."""
        self._require(ShardState.SHARDED, what="gather")
        self.state = ShardState.INFLIGHT
        self._publish()
        return self.full_flat()

    def to_gathered(self) -> None:
        """INFLIGHT -> GATHERED: the full buffer holds every rank's shard."""
        self._require(ShardState.INFLIGHT, what="finish gather")
        self.param.data = self._full.view(self.shape)
        self.state = ShardState.GATHERED
        self._publish()

    def to_sharded(self, in_place: bool = True, persistent_too: bool = False) -> None:
        """GATHERED -> SHARDED. `in_place`: frees the full tensor's bytes, views of it
        included (autograd's saved views come back when the backward re-gathers into the same
        storage). Otherwise the param lets go of the full tensor and the next gather allocates
        a new one: what a user took from it (`param.detach()`, and `.cpu()`, which is no copy
        on a CPU machine) keeps its values, and its memory, as under DeepSpeed, which replaces
        `param.data`. `persistent_too`: a persistent param too (empty_partition_cache; the
        next fetch gathers it again)."""
        self._require(ShardState.GATHERED, what="release")
        if self.persist and not persistent_too:
            raise RuntimeError(f"ZeRO-3 param ds_id={self.ds_id} is persistent; never released")
        self.param.data = self._empty
        if in_place:
            self._full.untyped_storage().resize_(0)
        else:
            self._full = None
        self.state = ShardState.SHARDED
        self._publish()

    def shard_in_memory(self) -> torch.Tensor:
        """The shard where it lives in memory (device, host or an arena); one on NVMe or not
        yet partitioned has none here."""
        if self.shard is None:
            raise RuntimeError(f"ZeRO-3 param {self.ds_id}: its shard is not in memory")
        return self.shard

    def move_shard(self, home: ShardHome, shard: Optional[torch.Tensor] = None) -> None:
        """The one place a shard's home changes (Note [Shard homes]): `shard` is the tensor
        that holds it now (None for NVME, whose bytes the swap store already has)."""
        where = f"ZeRO-3 param ds_id={self.ds_id} {tuple(self.shape)}"
        if home not in _SHARD_MOVES[self.home]:
            was = self.home.value if self.home is not None else "unplaced"
            raise RuntimeError(f"{where}: shard cannot move from {was} to {home.value}")
        if (shard is None) != (home is ShardHome.NVME):
            raise RuntimeError(
                f"{where}: a shard moving to {home.value} "
                + ("has no tensor" if shard is None else "keeps no tensor")
            )
        if shard is not None:
            if shard.numel() != self.shard_numel:
                raise RuntimeError(
                    f"{where}: shard of {shard.numel()} elements; expected {self.shard_numel}"
                )
            on_host = shard.device.type == "cpu"
            if home is not ShardHome.DEVICE and not on_host:
                raise RuntimeError(f"{where}: a {home.value} shard must be in host memory")
            if home is ShardHome.DEVICE and shard.device.type != self.device.type:
                raise RuntimeError(f"{where}: a device shard on {shard.device}, not {self.device}")
        self.shard, self.home = shard, home
        self._publish()

    def repoint(self, shard: Optional[torch.Tensor]) -> None:
        """The same shard (and home) in new storage, after engine.offload_states or
        reload_states moved the partition it is a view of (zero/state_offload.py); a gathered
        param's data is carved again from its full buffer, which moved too."""
        if shard is not None:
            if shard.numel() != self.shard_numel:
                raise RuntimeError(
                    f"ZeRO-3 param ds_id={self.ds_id}: shard of {shard.numel()} elements; "
                    f"expected {self.shard_numel}"
                )
            self.shard = shard
        if self.state is ShardState.GATHERED:
            self.param.data = self._full.view(self.shape)
        self._publish()

    @property
    def on_nvme(self) -> bool:
        """The shard's bytes are only in the swap store (read before use)."""
        return self.home is ShardHome.NVME

    def shard_values(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of `full` (the whole parameter), zero padded past the end
        (DeepSpeed's stage-3 layout, reference §1.8): a view of `full` when no padding is
        needed, else a new tensor. Callers only read it."""
        flat = full.reshape(-1)
        begin = self.rank * self.shard_numel
        if self.shard_valid == self.shard_numel:
            return flat[begin : begin + self.shard_numel]  # no padding: a view, no copy
        out = torch.zeros(self.shard_numel, dtype=self.dtype, device=full.device)
        if self.shard_valid:
            out[: self.shard_valid].copy_(flat[begin : begin + self.shard_valid])
        return out

    # --- the DeepSpeed-visible attributes --------------------------------------------------------
    def _publish(self) -> None:
        p = self.param
        p._zs = self
        p.ds_id = self.ds_id
        p.ds_shape = self.shape
        p.ds_numel = self.numel
        p.ds_tensor = self.shard if self.shard is not None else self._empty
        p.ds_persist = self.persist
        p.ds_status = _DS_STATUS[self.state]
        p.ds_process_group = self.group


class _Done:
    """The handle of a gather already complete."""

    def wait(self) -> None:
        return None


def zero_param_of(param) -> Optional[ZeroParam]:
    """The runtime state of a ZeRO-3 partitioned parameter, or None for any other tensor."""
    return getattr(param, "_zs", None) if isinstance(param, torch.Tensor) else None


def unique_zero_params(params) -> List[ZeroParam]:
    """The ZeRO-3 params among `params`, once each, in order (others are skipped)."""
    out, seen = [], set()
    for p in params:
        zp = zero_param_of(p)
        if zp is not None and zp.ds_id not in seen:
            seen.add(zp.ds_id)
            out.append(zp)
    return out

"""The optimizer sub-groups `offload_optimizer.ratio` keeps on the compute device: their
state, their update and where its results go (Note [The device tier]).

Note [The device tier]
~~~~~~~~~~~~~~~~~~~~~~
DeepSpeed's `offload_optimizer.ratio` (ZeRO stage 3 only) is the share of the optimizer
updated on the CPU: of a rank's n sub-groups, the first int((1 - ratio) * n) in step order
keep their master weights and Adam moments on the device and are stepped there, the rest are
offloaded. zerostream uses the same rule, so a config places the same sub-groups as in
DeepSpeed, and runs them through the sub-grouped optimizer of offload/optimizer_swap.py
whatever the offload device: with "cpu" the other sub-groups are its host tier, with "nvme"
zerostream.optimizer_max_in_cpu splits them between host memory and disk as without a ratio.
The placement changes no result beyond fp32 rounding: the device runs the CPU kernel's rule
(ops/device_adam.py) on the same values.

Note [Device-tier gradients stay on the device]
  Sub-groups are cut from each group's partition in order, so the device tier is a prefix of
  each group's partition: [0, d_g) (all of the first groups, part of one, none of the rest).
  The reducer's landing (zero/grad_reduce.py Landing.device_parts) adds a reduced gradient's
  elements below d_g into a device buffer of the gradient partition's dtype, on the compute
  stream, and sends only the rest down to the host partition, which holds only [d_g, n_g)
  (its element i is the partition's d_g + i, d_g being the device buffer's length), so
  no host memory is kept for gradients that never land there. So the device share's
  gradients never cross the link, as in DeepSpeed. The step's norm and overflow check read
  both (zero/sharded.py), and the parameter accessors (safe_get_full_grad and co,
  zero/param_access.py) read and write a fragment on either side of d_g through
  ShardedOptimizerBase.grad_read / grad_write.

  With `"zerostream": {"device_tier_grads": "host"}` they land in the host partition like
  the rest instead, and each device sub-group's slice goes back up for its update into one
  buffer as wide as the widest sub-group (a lane copy first waits for the compute stream, so
  the next upload into it follows the update that read it; the compute stream waits for the
  upload, on the device). The step ends with the host waiting for the last upload: the next
  backward lands gradients in that host memory. That costs 2 x 2-4 bytes an element of PCIe
  a step and saves 2-4 bytes an element of device memory, room for about a seventh more
  sub-groups on the device: the better trade when the CPU's share of the step is its bound,
  which `zerostream estimate` weighs when it plans a ratio.

A device sub-group's step runs on the compute stream (ops/device_adam.py, the CPU kernel's
rule); then the new master values become the 16-bit partition's: a device partition is
written on the compute stream; a host one (offload_param "cpu") goes down on the copy
stage's lane while the CPU steps the other sub-groups; NVMe shards take a blocking copy.

What it buys: the device holds 12 bytes an element (fp32 master, exp_avg, exp_avg_sq) for
its share, and its gradients (4 bytes, 2 when they land 16-bit) unless they go to the host;
host memory (or, under "nvme", 24 bytes an element of disk traffic per step) is saved on it,
and the CPU kernel's share of the step shrinks with it. On a machine without a GPU the device
is the CPU, and the tier is ordinary memory beside the host arena.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Dict, List, Optional

import torch

from .. import sizing
from ..accelerator import same_device
from ..ops.adam import adam_hyper
from ..ops.device_adam import device_adam_step
from . import sinks

if TYPE_CHECKING:
    from .copy_stage import CopyStage

logger = logging.getLogger("zerostream")

RATIO_KEY = "zero_optimization.offload_optimizer.ratio"


# How many of a rank's sub-groups offload_optimizer.ratio keeps on the device (sizing.py)
device_count = sizing.device_tier_count


class DeviceTier:
    """The device sub-groups' (param, exp_avg, exp_avg_sq), allocated on `device` in
    `kind_dtypes`, and their update."""

    def __init__(
        self,
        sub_groups: list,
        kind_dtypes: List[torch.dtype],
        device: torch.device,
        key: str = RATIO_KEY,
    ):
        self.device = device
        self.sub_groups = sub_groups
        self.kind_dtypes = kind_dtypes
        self.elements = sum(s.hi - s.lo for s in sub_groups)
        self.width = max((s.hi - s.lo for s in sub_groups), default=0)
        self.grad_parts: Dict[int, torch.Tensor] = {}  # group -> gradients [0, d_g)
        # zerostream.device_tier_grads "host": one buffer they are uploaded into, and the
        # copy stage's mark after this step's uploads
        self.grad_buf: Optional[torch.Tensor] = None
        self._uploaded = None
        self._downloaded = False  # updated slices on their way to a host partition
        try:
            for s in sub_groups:
                s.dev = [torch.empty(s.hi - s.lo, dtype=d, device=device) for d in kind_dtypes]
        except torch.OutOfMemoryError as exc:
            nbytes = self.elements * sum(d.itemsize for d in kind_dtypes)
            fix = "raise the ratio (the share offloaded)" if key == RATIO_KEY else "lower it"
            raise torch.OutOfMemoryError(
                f"{key}: the {len(sub_groups)} optimizer sub-groups it keeps on {device} "
                f"({nbytes / 2**30:.2f} GiB of master weights and moments) do not fit there; "
                f"{fix} or lower sub_group_size: {exc}"
            ) from exc

    def make_grad_parts(self, dtype: torch.dtype) -> Dict[int, torch.Tensor]:
        """The device buffers the reducer lands the tier's gradients in (Note [Device-tier
        gradients stay on the device]): per group, elements [0, d_g), zeroed."""
        ends: Dict[int, int] = {}
        for s in self.sub_groups:
            if s.lo != ends.get(s.group, 0):
                raise RuntimeError(
                    f"{RATIO_KEY}: the device sub-groups of param group {s.group} are not a "
                    f"prefix of its partition (a sub-group starts at {s.lo})"
                )
            ends[s.group] = s.hi
        self.grad_parts = {
            g: torch.zeros(d, dtype=dtype, device=self.device) for g, d in ends.items()
        }
        return self.grad_parts

    @property
    def state_bytes(self) -> int:
        return self.elements * sum(d.itemsize for d in self.kind_dtypes)

    def tensors(self, kinds: range) -> List[torch.Tensor]:
        """The state tensors of the given kind indexes (0 param, 1 exp_avg, 2 exp_avg_sq)."""
        return [s.dev[k] for s in self.sub_groups for k in kinds]

    def update(
        self,
        s,
        grads,
        partitions,
        group: dict,
        step: int,
        adamw_mode: bool,
        grad_scale: float,
        stage: Optional["CopyStage"],
    ) -> None:
        """One sub-group's step (Note [The device tier]), from its gradients on the device,
        or with zerostream.device_tier_grads "host" uploaded from the host partition first."""
        n = s.hi - s.lo
        if self.grad_parts:
            grad = self.grad_parts[s.group][s.lo : s.hi]
        else:
            host_grad = grads[s.group][s.lo : s.hi]
            if self.grad_buf is None or self.grad_buf.dtype != host_grad.dtype:
                self.grad_buf = torch.empty(self.width, dtype=host_grad.dtype, device=self.device)
            grad = self.grad_buf[:n]
            if stage is not None:
                stage.upload(host_grad, grad)
                self._uploaded = stage.upload_mark()
                stage.fence()  # the compute stream reads it next
            else:
                grad.copy_(host_grad)
        p, m, v = s.dev
        device_adam_step(p, grad, m, v, **adam_hyper(group, step, adamw_mode, grad_scale))
        if write_partition(partitions[s.group], s.lo, s.hi, p, stage):
            self._downloaded = True

    def finish(self, stage: Optional["CopyStage"]) -> None:
        """The end of a step: the host knows every gradient upload has read its source (the
        next backward lands gradients there), and every updated slice downloaded to a host
        partition has landed (the next forward's gathers read it)."""
        if stage is not None and self._downloaded:
            stage.drain()
        elif stage is not None and self._uploaded is not None:
            stage.host_wait_mark(self._uploaded)
        self._uploaded = None
        self._downloaded = False


def write_partition(sink, lo: int, hi: int, values: torch.Tensor, stage=None) -> bool:
    """Elements [lo, hi) of a 16-bit partition from device `values`: in place on the device
    for a partition there (a DeviceSink's or a plain one); into a host partition
    (offload_param "cpu") on the copy stage's download lane, converted on the device first,
    while the CPU updates the other sub-groups (the step's finish() drains it); NVMe shards
    through a blocking copy. Returns whether a download was queued."""
    from .copy_stage import DeviceSink

    target = sink.part if isinstance(sink, DeviceSink) else sink
    if isinstance(sink, DeviceSink) or (
        stage is None and torch.is_tensor(target) and same_device(target.device, values.device)
    ):
        target[lo:hi].copy_(values)
        return False
    if stage is not None and torch.is_tensor(target):  # a host partition (the update's own)
        part = target[lo:hi]

        def land(at: int, chunk: torch.Tensor) -> None:
            part[at : at + chunk.numel()].copy_(chunk)

        stage.to_host(values.to(target.dtype), land)
        return True
    sinks.write_piece(sink, lo, hi, values.to("cpu"))
    return False

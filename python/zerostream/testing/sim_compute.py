"""The simulated device's compute stream (Note [The simulated device] in sim_device.py): the
ops the host thread runs while it is current, which of their results are device memory, the
non_blocking copies issued on it outside the copy stage (the compute pseudo-lane), and the
host's blocking reads of device memory.

Note [Device memory on the simulated device]
  Every tensor is a CPU tensor, yet a GPU treats device and host memory differently: a
  copy between them is a DMA, a read of device memory by the host waits for the stream.
  The engine names the simulated device `cpu:<index>` (accelerator.bind_run_device), and
  torch keeps that index in the arguments an op is dispatched with, though the tensor it
  makes says plain `cpu`. So a storage is the device's when a factory or a copy named the
  device, or when an op made it from an input that is the device's; everything else is
  host memory (pageable, unless it lies in a registered range); `torch.tensor(data,
  device=...)`, which dispatches no op naming the device, is tagged from its call. The
  engine's paths for a run on the host itself (4 KiB-aligned flat buffers, the host-memory
  preflight) ask accelerator.is_host_run, which says no for `cpu:<rank>`, so the sim takes
  the GPU's paths; a tensor is compared with the engine's device by accelerator.same_device.

Note [The compute pseudo-lane]
  The compute stream is the host thread, so an op on it is done when issued: right for the
  device's own order (a later op on the stream, or a lane that waited for it, sees its
  result), wrong for the host. On a GPU `dst.copy_(src, non_blocking=True)` between a
  device tensor and page-locked host memory is queued on the current stream and returns at
  once: the host may read a download's destination, or rewrite an upload's source, only
  after it synchronized with the stream (a blocking read of device memory, an event's or
  the stream's synchronize, torch.cuda.synchronize). So such a copy issued on the compute
  stream is kept here as pending, with its position (the compute op count): a download's
  host side holds poison until the host synchronizes past it, and an upload's source is
  snapshot and must be unchanged when the host does. With pageable host memory (or device
  to device) the copy is synchronous for the host on a GPU, so nothing is pending.

  Host reads. `.item()`, `float()`, `.tolist()` and `.cpu()`/`.to("cpu")` of device memory
  block the host until the compute stream caught up: counted ("host_reads";
  "blocking_downloads" for the non-scalar ones, with the line that made each in
  `read_sites`) and a synchronization of the pseudo-lane.
"""

from __future__ import annotations

import threading
from typing import Dict, List

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .sim_streams import _alias, _poison

aten = torch.ops.aten
_SCALAR_READS = (aten._local_scalar_dense.default,)
_COPIES = (aten.copy_.default,)


class _Pending:
    __slots__ = ("ops", "upload", "host", "kept", "registered")

    def __init__(self, ops, upload, host, kept):
        self.ops, self.upload, self.host, self.kept = ops, upload, host, kept


class ComputeLane:
    """Note [The compute pseudo-lane]: the non_blocking copies queued on the compute stream,
    pending until the host synchronizes with it."""

    def __init__(self, sim):
        self.sim = sim
        self.pending: List[_Pending] = []

    def copied(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """`dst.copy_(src, non_blocking=True)` ran on the compute stream (dst holds the
        result): kept pending when one side is page-locked host memory and the other the
        device's."""
        sim = self.sim
        download = sim.on_device(src) and sim._registered(dst)
        if not download and not (sim.on_device(dst) and sim._registered(src)):
            return  # device to device, or pageable host memory: no DMA the host must wait for
        with sim.internal():
            if download:  # the host sees its values after it synchronizes
                item = _Pending(sim.compute_ops, False, _alias(dst), dst.clone())
                _poison(dst)
            else:  # an upload: the DMA may read the source until then
                item = _Pending(sim.compute_ops, True, _alias(src), src.clone())
        sim.count("compute_lane_copies")
        self.pending.append(item)

    def has_pending(self, upto: int) -> bool:
        return any(p.ops <= upto for p in self.pending)

    def land(self, upto: float) -> None:
        """The host synchronized with the compute stream up to op `upto`."""
        due = [p for p in self.pending if p.ops <= upto]
        if not due:
            return
        self.pending = [p for p in self.pending if p.ops > upto]
        with self.sim.internal():
            for p in due:
                if p.upload and not torch.equal(p.host, p.kept):
                    self.sim._violate(
                        "the host rewrote the source of a non_blocking copy to the device on "
                        "the compute stream before it synchronized with the stream"
                    )
                elif not p.upload:
                    p.host.copy_(p.kept)


def _is_device_memory(sim, t: torch.Tensor) -> bool:
    """Whether `t` is device memory (Note [Device memory on the simulated device])."""
    return sim.on_device(t)


class DeviceTags:
    """Note [Device memory on the simulated device]: which storages are the device's."""

    def __init__(self):
        self.storages: Dict[int, StorageWeakRef] = {}

    def has(self, t: torch.Tensor) -> bool:
        ref = self.storages.get(t.untyped_storage()._cdata)
        return ref is not None and not ref.expired()

    def tag(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        self.storages[storage._cdata] = StorageWeakRef(storage)
        if len(self.storages) % 4096 == 0:  # now and then, forget the storages gone
            self.storages = {k: r for k, r in self.storages.items() if not r.expired()}

    def after(self, func, args, kwargs, out) -> None:
        """Tags the new storages of an op's outputs made on the device: by a factory or a
        copy naming the device (an index: "cpu:<rank>"), else when an input is the device's."""
        device = kwargs.get("device")
        if isinstance(device, torch.device):
            on_device = device.index is not None
        else:
            on_device = any(
                isinstance(t, torch.Tensor) and self.has(t) for t in tree_leaves((args, kwargs))
            )
        if not on_device:
            return
        inputs = {
            t.untyped_storage()._cdata
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in inputs:
                self.tag(t)


def _to_host(args, kwargs) -> bool:
    """Whether Tensor.to(*args, **kwargs) names the host as its device (blocking)."""
    if kwargs.get("non_blocking") or (len(args) > 1 and args[1] is True):
        return False
    device = kwargs.get("device", args[0] if args else None)
    if isinstance(device, torch.Tensor):
        device = device.device
    if isinstance(device, (str, torch.device)):
        return torch.device(device).type == "cpu"
    return False


class ComputeOps(TorchDispatchMode):
    """Counts the ops the host thread runs while the compute stream is current (its
    position, which a lane must wait for before copying), feeds the memory model, and
    keeps the compute stream's non_blocking copies (Note [The compute pseudo-lane])."""

    def __init__(self, sim):
        super().__init__()
        self.sim = sim

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        sim = self.sim
        kwargs = kwargs or {}
        internal = sim._local.__dict__.get("internal")
        on_compute = not internal and sim.current_stream().host
        if on_compute:
            sim.compute_ops += 1
            me = threading.get_ident()
            sim.thread_ops[me] = sim.thread_ops.get(me, 0) + 1
            if func in _SCALAR_READS and _is_device_memory(sim, args[0]):
                sim.host_read(args[0], scalar=True)
        out = func(*args, **kwargs)
        if not internal:
            sim.tags.after(func, args, kwargs, out)
        if on_compute and func in _COPIES:
            non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
            if non_blocking:
                sim.compute_lane.copied(args[0], args[1])
        if sim.memory is not None and not internal:
            sim.memory.allocated(out, sim.current_stream())
        return out


_FROM_DATA = (torch.tensor, torch.as_tensor)


class HostReads(TorchFunctionMode):
    """`.cpu()` and a blocking `.to("cpu")` of device memory: Tensor.to returns the tensor
    itself when nothing changes (everything is on the CPU here), so no op reaches the
    dispatch mode; the call is seen here. So is `torch.tensor(data, device=...)`, whose
    copy to the device dispatches no op that names it."""

    def __init__(self, sim):
        super().__init__()
        self.sim = sim

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        sim = self.sim
        if func in _FROM_DATA and not sim._local.__dict__.get("internal"):
            out = func(*args, **kwargs)
            device = kwargs.get("device")
            if isinstance(device, (str, torch.device)) and torch.device(device).index is not None:
                sim.tags.tag(out)  # no op names the device: torch.tensor copies in C++
            return out
        if (
            func in (torch.Tensor.cpu, torch.Tensor.to, torch.Tensor.tolist)
            and args
            and isinstance(args[0], torch.Tensor)
            and not sim._local.__dict__.get("internal")
            and (func is not torch.Tensor.to or _to_host(args[1:], kwargs))
            and _is_device_memory(sim, args[0])
        ):
            sim.host_read(args[0], scalar=func is torch.Tensor.tolist or args[0].dim() == 0)
        return func(*args, **kwargs)

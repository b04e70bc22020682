"""The simulated device's collectives (Note [The simulated device] in sim_device.py): torch's
tensor collectives run at issue, after the stream they are issued from; issued with
async_op, their outputs hold poison until the program waits for the handle. Object
collectives and barriers check the thread's current device."""

from __future__ import annotations

import time
from typing import Callable

import torch.distributed as dist

from .sim_streams import _poison


def collective(sim, name: str, fn, args: tuple, kwargs: dict):
    """A tensor collective (Note [The simulated device]): run at issue
    (it reads its inputs then, after the stream it is issued from), and, issued with
    async_op, its outputs hold poison until the program waits for its handle."""
    before_collective(sim, name)
    if not kwargs.get("async_op") or name in _UNCOMPARED_P2P:
        sim.collective_log.append(("sync", name))
        return fn(*args, **kwargs)
    kwargs = {**kwargs, "async_op": False}
    fn(*args, **kwargs)
    outputs = args[0] if args else kwargs.get("tensor", kwargs.get("tensor_list"))
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    with sim.internal():
        results = [t.clone() for t in outputs]
        for t in outputs:
            _poison(t)
    sim.collective_log.append(("async", name))
    return SimWork(sim, name, outputs, results)


def before_collective(sim, what: str) -> None:
    """A tensor collective: NCCL's stream waits for the current stream, so one issued
    from a lane reads what that lane produced."""
    stream = sim.current_stream()
    if stream.host:
        return
    sim.count("lane_collectives")
    if stream.caught_up < sim.compute_ops:
        sim._violate(
            f"{what} was issued from {stream.name} without the lane waiting for the "
            f"compute stream ({sim.compute_ops - stream.caught_up} ops queued there since)"
        )
    sim._complete(stream, stream.issued)


class SimWork:
    """The handle of an asynchronous collective on the simulated device: its outputs hold
    poison until wait(), which puts the results there (the compute stream then waits for
    the collective's stream, as NCCL's Work.wait does). is_completed() follows the policy:
    lazily, never before wait()."""

    def __init__(self, sim, name: str, outputs, results):
        self.sim, self.name = sim, name
        self.outputs, self.results = outputs, results
        self.done = False
        self.due = sim._due()

    def wait(self, timeout=None) -> bool:
        if not self.done:
            with self.sim.internal():
                for t, r in zip(self.outputs, self.results):
                    t.copy_(r)
            self.done = True
            self.outputs = self.results = None
            self.sim.collective_log.append(("wait", self.name))
            self.sim.count("collective_waits")
        return True

    def is_completed(self) -> bool:
        return self.done or (self.sim.policy != "lazy" and time.monotonic() >= self.due)

    def get_future(self):
        raise NotImplementedError("the simulated device's collectives have no futures")


# Point-to-point calls run as issued (a recv's buffer is the program's to wait on).
_UNCOMPARED_P2P = ("send", "recv", "isend", "irecv")

_TENSOR_COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "reduce_scatter",
    "reduce",
    "all_to_all_single",
    "all_to_all",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
)
_DEVICE_BOUND = ("all_gather_object", "broadcast_object_list", "barrier", "gather_object")


def install(sim) -> Callable[[], None]:
    """Routes torch.distributed's entry points through `sim`; returns what puts them back."""
    saved = {name: getattr(dist, name) for name in _TENSOR_COLLECTIVES + _DEVICE_BOUND}

    def tensor_collective(name, fn):
        def call(*args, **kwargs):
            return collective(sim, name, fn, args, kwargs)

        return call

    def device_bound(name, fn):
        def call(*args, **kwargs):
            sim.check_rank_device(name)
            return fn(*args, **kwargs)

        return call

    for name in _TENSOR_COLLECTIVES:
        setattr(dist, name, tensor_collective(name, saved[name]))
    for name in _DEVICE_BOUND:
        setattr(dist, name, device_bound(name, saved[name]))

    def restore() -> None:
        for name, fn in saved.items():
            setattr(dist, name, fn)

    return restore

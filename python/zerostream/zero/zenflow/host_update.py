"""The host side of ZenFlow: every step's gradient partition adds into an fp32 accumulator,
and at each update step (schedule.py) the run's CPU Adam steps the fp32 masters with the
interval's sum; the updated masters then become the 16-bit weights of every column that is
not selected (the selected ones keep their device-side values).

Note [ZenFlow's overlapped host update]: with overlap_step the update of an interval runs on
a thread while the next interval's steps train, as DeepSpeed runs it in an optimizer
process: at update step b_k the update of interval k starts (its gradients, clipped by their
own norm, numbered step b_k + 1), and its result reaches the weights at the next update step
b_{k+1}, before interval k+1's update starts. The weights the device trains on in interval
k+1 are therefore one host update behind, which is ZenFlow's trade. The accumulator is
double-buffered: interval k+1 adds into one buffer while the thread reads the other.
During warm-up each update is waited for at once (DeepSpeed's too). Where DeepSpeed
overwrites the masters from the device weights at a selection step while the last update
may still be running in its process (a race), zerostream waits for it and applies it
first; the selection step then starts with nothing in flight, as after warm-up. The Adam
moments are one set; DeepSpeed's native worker keeps two, one per accumulator buffer, which
reads as a by-product of its double-buffering rather than a rule, and is not copied.
"""

from __future__ import annotations

import threading
from typing import Callable, List, Optional

import torch


class _Update:
    """One update running on a thread; wait() returns once it finished, re-raising its error."""

    def __init__(self, run: Callable[[], None]):
        self.error: Optional[BaseException] = None

        def body() -> None:
            try:
                run()
            except BaseException as exc:  # handed to the training thread at wait()
                self.error = exc

        self.thread = threading.Thread(target=body, name="zenflow-host-update", daemon=True)
        self.thread.start()

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise RuntimeError("ZenFlow's overlapped host update failed") from self.error


class HostUpdate:
    def __init__(self, opt, overlap: bool, threads: Optional[int]):
        """`opt`: the ZenFlow optimizer (its masters, inner CPU Adam, norm and apply)."""
        self.opt = opt
        self.overlap = overlap
        self.threads = threads
        sizes = [g.numel() for g in opt.grads]
        self.acc: List[List[torch.Tensor]] = [
            [torch.zeros(n, dtype=torch.float32) for n in sizes] for _ in range(2 if overlap else 1)
        ]
        self.current = 0
        self.pending: Optional[_Update] = None

    def accumulate(self, grads: List[torch.Tensor]) -> None:
        for a, g in zip(self.acc[self.current], grads):
            a.add_(g)

    def settle(self) -> None:
        """Waits for an update in flight and applies it (Note [ZenFlow's overlapped host
        update])."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.wait()
            self.opt.apply_masters()

    def update(self, t: int, divisor: float, asynchronous: bool) -> bool:
        """The update at step t of the accumulated gradients (sums over ranks, to be divided
        by `divisor`); False when their norm overflowed (nothing changes). Synchronous unless
        `asynchronous` (overlap_step after warm-up)."""
        self.settle()
        acc = self.acc[self.current]
        opt = self.opt
        norm_sq = opt._norm_and_overflow(acc, partitioned=True) / divisor**2
        factor = opt._grad_factor(norm_sq)
        if factor is None:
            for a in acc:
                a.zero_()
            return False
        inner = opt.optimizer
        for m in opt.masters:
            inner.set_step(m, t)  # DeepSpeed's step_id: the update runs as step t + 1
        inner.bind_grads(dict(zip(opt.masters, acc)))
        scale = factor / divisor

        def run() -> None:
            inner.step(grad_scale=scale)
            for a in acc:
                a.zero_()

        if not asynchronous:
            run()
            opt.apply_masters()
            return True
        if self.threads is not None:
            inner.threads = self.threads
        self.pending = _Update(run)
        self.current = (self.current + 1) % len(self.acc)
        return True

"""The copy stage's lanes: one stream per direction on a GPU (CudaLanes over TorchCuda, the
seam the simulated device replaces), or the CPU twin (HostLanes) where copies are memcpy done
when queued (Note [The copy stage] in copy_stage.py)."""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Deque, Dict, Optional

import torch


class HostLanes:
    """The CPU twin: copies are memcpy, done when queued."""

    kind = "host"

    def __init__(self):
        self.busy = {"h2d": 0.0, "d2h": 0.0}

    def copy(self, dst: torch.Tensor, src: torch.Tensor, upload: bool):
        start = time.perf_counter()
        dst.copy_(src)
        self.busy["h2d" if upload else "d2h"] += time.perf_counter() - start
        return None

    def busy_seconds(self) -> Dict[str, float]:
        """Seconds each direction's copies took so far."""
        return dict(self.busy)

    def ready(self, event) -> bool:
        return True

    def host_wait(self, event) -> None:
        pass

    def device_wait(self, event) -> None:
        pass

    def after_uploads(self, launch: Callable[[], object]):
        return launch()

    def bind_thread(self) -> None:
        pass


class TorchCuda:
    """The few torch.cuda calls CudaLanes makes, behind one seam so that the GPU path runs
    without a GPU: on the simulated device of the tests (zerostream/testing/sim_device.py)
    and the recording fake of the device audit (tests/python/zero/test_device_audit.py)."""

    def __init__(self, device: torch.device):
        self.device = device

    def new_stream(self):
        return torch.cuda.Stream(device=self.device)

    def current_stream(self):
        return torch.cuda.current_stream(self.device)

    def use(self, stream):
        return torch.cuda.stream(stream)

    def new_event(self, timing: bool = False, blocking: bool = False):
        return torch.cuda.Event(enable_timing=timing, blocking=blocking)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, upload: bool) -> None:
        """dst <- src on the current stream, asynchronously (page-locked host memory)."""
        dst.copy_(src, non_blocking=True)

    def keep_alive(self, tensor: torch.Tensor, stream) -> None:
        tensor.record_stream(stream)

    def seen_complete(self, event) -> None:
        """The host saw `event` complete (query() said so). synchronize() then returns at
        once; it is called for torch's stream sanitizer (TORCH_CUDA_SANITIZER), which models
        synchronize() but not query(): without it, memory a lane read and the caching
        allocator handed out again reads as a race with the compute stream's next write."""
        event.synchronize()

    def bind_thread(self) -> None:
        """Makes the device current on the calling thread: a thread that never sets one is
        on device 0, where its first CUDA call creates a context (every rank's, on GPU 0)."""
        torch.cuda.set_device(self.device)


class CudaLanes:
    """A dedicated stream per direction; events order slot reuse and the compute stream."""

    kind = "cuda"

    # Timed copies not yet summed, per direction; summed (and dropped) as they complete,
    # checked at every copy beyond this many so the queue stays short without a host wait.
    TIMED_BACKLOG = 64

    def __init__(self, cuda: TorchCuda):
        self.cuda = cuda
        self.down = cuda.new_stream()
        self.up = cuda.new_stream()
        self.busy = {"h2d": 0.0, "d2h": 0.0}
        self._timed: Dict[str, Deque[tuple]] = {"h2d": deque(), "d2h": deque()}

    def copy(self, dst: torch.Tensor, src: torch.Tensor, upload: bool):
        lane = self.up if upload else self.down
        lane.wait_stream(self.cuda.current_stream())
        with self.cuda.use(lane):
            # Blocking events: a host wait on them sleeps instead of spinning a core the
            # CPU optimizer needs. The pair brackets the DMA for busy_seconds().
            start = self.cuda.new_event(timing=True, blocking=True)
            start.record(lane)
            self.cuda.copy(dst, src, upload)
            event = self.cuda.new_event(timing=True, blocking=True)
            event.record(lane)
        device_side = dst if upload else src
        self.cuda.keep_alive(device_side, lane)  # not freed by the caching allocator mid-copy
        timed = self._timed["h2d" if upload else "d2h"]
        timed.append((start, event))
        if len(timed) > self.TIMED_BACKLOG:
            self._sum_completed()
        return event

    def _sum_completed(self) -> None:
        for direction, timed in self._timed.items():
            while timed and timed[0][1].query():  # a lane completes its copies in order
                start, end = timed.popleft()
                self.busy[direction] += start.elapsed_time(end) / 1000.0

    def busy_seconds(self) -> Dict[str, float]:
        """Seconds each lane spent on the copies that have completed so far."""
        self._sum_completed()
        return dict(self.busy)

    def ready(self, event) -> bool:
        if not event.query():
            return False
        self.cuda.seen_complete(event)
        return True

    def host_wait(self, event) -> None:
        event.synchronize()

    def device_wait(self, event) -> None:
        self.cuda.current_stream().wait_event(event)

    def bind_thread(self) -> None:
        self.cuda.bind_thread()

    def after_uploads(self, launch: Callable[[], object]):
        """Runs `launch` (a collective) with the upload lane current: NCCL's stream waits for
        the stream current at the call, so the collective follows the uploads (and, as the
        lane first waits for the compute stream, whatever was queued there) while the compute
        stream goes on."""
        self.up.wait_stream(self.cuda.current_stream())
        with self.cuda.use(self.up):
            return launch()


# Set by zerostream.testing.sim_device while a test runs on the simulated device: a factory
# of TorchCuda stand-ins, so every copy stage takes the GPU path (CudaLanes) there.
simulated_cuda: Optional[Callable[[torch.device], object]] = None


def lanes_for(device: torch.device):
    """CudaLanes for a CUDA device (or the simulated one), the CPU twin otherwise."""
    if simulated_cuda is not None:
        return CudaLanes(simulated_cuda(device))
    if device.type == "cuda":
        return CudaLanes(TorchCuda(device))
    return HostLanes()

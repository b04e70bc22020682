"""`zerostream.accelerator.get_accelerator()`: the device abstraction DeepSpeed scripts call.

Two kinds: CUDA when torch sees a GPU, else CPU (the first-class path here). `ZS_ACCELERATOR`
or DeepSpeed's `DS_ACCELERATOR` (`cpu` or `cuda`) forces one.
"""

from __future__ import annotations

import functools
import os
from typing import Optional, Tuple, Union

import torch


def _native_pins():
    """The process's locked tensors when DS_PIN_MEMORY_BACKEND=native, else None."""
    from zerostream.offload.locked_tensors import locked_tensors, native_backend

    return locked_tensors() if native_backend() else None


def pin_tally():
    """The process's pinned-memory tally (offload/pin_tally.py)."""
    from zerostream.offload.pin_tally import tally

    return tally()


class _Accelerator:
    _name = ""
    _backend = ""

    def device_name(self, device_index: Optional[int] = None) -> str:
        return self._name if device_index is None else f"{self._name}:{device_index}"

    def communication_backend_name(self) -> str:
        return self._backend

    # DeepSpeed's tensor constructors on the accelerator (`get_accelerator().ByteTensor(data)`):
    # torch.tensor of that dtype on this accelerator's device.
    def _tensor_of(self, dtype: torch.dtype):
        return functools.partial(torch.tensor, dtype=dtype, device=self.device_name())

    ByteTensor = property(lambda self: self._tensor_of(torch.uint8))
    IntTensor = property(lambda self: self._tensor_of(torch.int32))
    LongTensor = property(lambda self: self._tensor_of(torch.int64))
    HalfTensor = property(lambda self: self._tensor_of(torch.float16))
    BFloat16Tensor = property(lambda self: self._tensor_of(torch.bfloat16))
    FloatTensor = property(lambda self: self._tensor_of(torch.float32))
    DoubleTensor = property(lambda self: self._tensor_of(torch.float64))

    def is_bf16_supported(self) -> bool:
        return True

    # The random-number state of the device (DeepSpeed's accelerator API: activation
    # checkpointing and DeepSpeed's tests save and restore it around a recomputation).
    def get_rng_state(self, device_index: Optional[int] = None) -> torch.Tensor:
        if self._name == "cuda":
            return torch.cuda.get_rng_state("cuda" if device_index is None else device_index)
        return torch.get_rng_state()

    def set_rng_state(self, new_state: torch.Tensor, device_index: Optional[int] = None) -> None:
        if self._name == "cuda":
            torch.cuda.set_rng_state(new_state, "cuda" if device_index is None else device_index)
        else:
            torch.set_rng_state(new_state)

    def initial_seed(self) -> int:
        return torch.cuda.initial_seed() if self._name == "cuda" else torch.initial_seed()

    def default_generator(self, device_index: int):
        if self._name == "cuda":
            return torch.cuda.default_generators[device_index]
        return torch.default_generator

    def supported_dtypes(self) -> list:
        """The floating dtypes models may train in here (DeepSpeed's accelerator API)."""
        dtypes = [torch.float32]
        if self.is_bf16_supported():
            dtypes.append(torch.bfloat16)
        if self.is_fp16_supported():
            dtypes.append(torch.float16)
        return dtypes

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` is in page-locked memory (inside a locked tensor's range under
        DS_PIN_MEMORY_BACKEND=native); False for one without storage (meta, fake tensors),
        whose bytes must not be touched."""
        if tensor.is_meta or type(tensor).__name__ == "FakeTensor":
            return False
        pins = _native_pins()
        if pins is not None and pins.is_pinned(tensor):
            return True
        try:
            return bool(tensor.is_pinned())
        except (RuntimeError, NotImplementedError):
            return False

    def unpin_memory(self, tensor: torch.Tensor) -> Optional[bool]:
        """Native backend: forgets the tensor's locked range (True if it had one). Torch
        backend: None, nothing to do (torch's pinned memory goes with the tensor)."""
        pins = _native_pins()
        return None if pins is None else pins.unpin(tensor)

    def pin_memory(
        self, tensor: torch.Tensor, make_copy: bool = True, match_shape: bool = True
    ) -> torch.Tensor:
        """DeepSpeed's: under DS_PIN_MEMORY_BACKEND=native a page-locked copy from the
        process's locked tensors (offload/locked_tensors.py; `make_copy` False leaves its
        values unset, `match_shape` False makes it flat), else this accelerator's torch
        pinning. Both are counted in the pinned-memory tally."""
        pin_tally().track(tensor.nbytes)
        pins = _native_pins()
        if pins is not None:
            return pins.pin(tensor, make_copy, match_shape)
        return self._torch_pin_memory(tensor)

    def _torch_pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # What each accelerator implements (CpuAccelerator, CudaAccelerator), declared here so
    # callers of get_accelerator() are type-checked against one interface.
    def current_device(self) -> Union[int, str]:
        raise NotImplementedError

    def device_count(self) -> int:
        raise NotImplementedError

    def set_device(self, device_index: int) -> None:
        raise NotImplementedError

    def synchronize(self, device_index: Optional[int] = None) -> None:
        raise NotImplementedError

    def is_fp16_supported(self) -> bool:
        raise NotImplementedError

    def empty_cache(self) -> None:
        raise NotImplementedError

    def memory_room(self) -> Optional[Tuple[int, int, int]]:
        raise NotImplementedError

    def memory_allocated(self, device_index: Optional[int] = None) -> int:
        raise NotImplementedError

    def max_memory_allocated(self, device_index: Optional[int] = None) -> int:
        raise NotImplementedError

    def reset_memory_peak(self) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<zerostream accelerator {self._name}>"


class CpuAccelerator(_Accelerator):
    """On CPU, "device" memory is host memory; ranks are processes talking Gloo."""

    _name = "cpu"
    _backend = "gloo"

    def current_device(self) -> str:
        """ "cpu", as torch.cpu.current_device() answers: code that places a tensor with
        `device=get_accelerator().current_device()` (DeepSpeed's tests do) gets a host
        tensor, where an index 0 would mean CUDA device 0."""
        return "cpu"

    def current_device_name(self) -> str:
        return "cpu"

    def device_name(self, device_index: Optional[int] = None) -> str:
        """ "cpu" for any index, as DeepSpeed's CPU accelerator: every rank's device is the
        host, and code that compares names (DeepSpeed's own tests) expects no index."""
        return "cpu"

    def device_count(self) -> int:
        local = int(os.environ.get("LOCAL_SIZE", "0") or 0)
        return local if local > 0 else 1

    def is_available(self) -> bool:
        return True

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: Optional[int] = None) -> None:
        pass

    def is_synchronized_device(self) -> bool:
        return True

    def is_fp16_supported(self) -> bool:
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
        except (AttributeError, RuntimeError):
            return False

    def _torch_pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        # Torch's page-locking only helps DMA to a GPU; there is none.
        return tensor

    def empty_cache(self) -> None:
        pass

    def memory_allocated(self, device_index: Optional[int] = None) -> int:
        import psutil

        return psutil.Process().memory_info().rss

    def max_memory_allocated(self, device_index: Optional[int] = None) -> int:
        """The process's peak resident memory (the kernel's high-water mark)."""
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def total_memory(self, device_index: Optional[int] = None) -> int:
        import psutil

        return psutil.virtual_memory().total

    def memory_room(self) -> Optional[Tuple[int, int, int]]:
        """(bytes the current device can still give this process, bytes the work since the
        last reset_memory_peak() held above what is held now, the device's total), or None
        where the device's memory is the host's (here: a device tier would only move state
        from one part of host memory to another)."""
        return None

    def reset_memory_peak(self) -> None:
        pass


class CudaAccelerator(_Accelerator):
    _name = "cuda"
    _backend = "nccl"

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def current_device_name(self) -> str:
        return f"cuda:{torch.cuda.current_device()}"

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def set_device(self, device_index: int) -> None:
        torch.cuda.set_device(device_index)

    def synchronize(self, device_index: Optional[int] = None) -> None:
        torch.cuda.synchronize(device_index)

    def is_synchronized_device(self) -> bool:
        return False

    def is_fp16_supported(self) -> bool:
        return True

    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported()

    def max_memory_allocated(self, device_index: Optional[int] = None) -> int:
        return torch.cuda.max_memory_allocated(device_index)

    def manual_seed(self, seed: int) -> None:
        torch.cuda.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.cuda.manual_seed_all(seed)

    def _torch_pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.pin_memory()

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def memory_allocated(self, device_index: Optional[int] = None) -> int:
        return torch.cuda.memory_allocated(device_index)

    def total_memory(self, device_index: Optional[int] = None) -> int:
        return torch.cuda.get_device_properties(device_index or 0).total_memory

    def memory_room(self) -> Optional[Tuple[int, int, int]]:
        # What the driver has free, plus what the caching allocator holds unused (blocks it
        # hands out again before asking the driver); the peak is the allocator's.
        free, total = torch.cuda.mem_get_info()
        held = torch.cuda.memory_allocated()
        cached = torch.cuda.memory_reserved() - held
        return free + cached, torch.cuda.max_memory_allocated() - held, total

    def reset_memory_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats()


_ACCELERATOR: Optional[_Accelerator] = None


def get_accelerator() -> _Accelerator:
    global _ACCELERATOR
    if _ACCELERATOR is None:
        forced = os.environ.get("ZS_ACCELERATOR") or os.environ.get("DS_ACCELERATOR")
        if forced not in (None, "", "cpu", "cuda"):
            raise ValueError(
                f'ZS_ACCELERATOR/DS_ACCELERATOR: expected one of "cpu", "cuda"; got {forced!r}'
            )
        if forced == "cuda" and not torch.cuda.is_available():
            raise ValueError("DS_ACCELERATOR=cuda, but torch sees no CUDA device")
        use_cuda = (
            forced == "cuda" or (forced is None or forced == "") and torch.cuda.is_available()
        )
        _ACCELERATOR = CudaAccelerator() if use_cuda else CpuAccelerator()
    return _ACCELERATOR


def set_accelerator(accelerator: _Accelerator) -> None:
    global _ACCELERATOR
    if not isinstance(accelerator, _Accelerator):
        raise TypeError(
            f"set_accelerator: expected a zerostream accelerator, got {type(accelerator).__name__}"
        )
    _ACCELERATOR = accelerator


def is_host_run(device: torch.device) -> bool:
    """Whether the run's `device` is the host itself (the CPU path): not a GPU, and not the
    simulated device, which is named `cpu:<rank>` (Note [Device memory on the simulated
    device] in testing/sim_compute.py) so that its memory takes the device's paths."""
    return device.type == "cpu" and device.index is None


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether a tensor on `a` is on `b`. A CPU tensor's device has no index while the
    simulated device is named `cpu:<rank>` (Note [Device memory on the simulated device] in
    testing/sim_compute.py): there an index on one side only does not tell them apart, as a
    tensor on the device compares with the engine's device on a GPU."""
    if a.type != b.type:
        return False
    return a.index is None or b.index is None or a.index == b.index


def bind_run_device(local_rank: int) -> torch.device:
    """This process's device (`cuda:<local_rank>`, or the CPU), made current on the calling
    thread, as DeepSpeed's engine does: when the user made the process group, nothing else
    set it, and the object collectives (stage 3's trace check, checkpoint save and load,
    barriers) would put every local rank's bytes on GPU 0."""
    acc = get_accelerator()
    acc.set_device(local_rank)  # a no-op on the CPU (recorded by the simulated device)
    if getattr(acc, "simulated", False):
        return torch.device("cpu", local_rank)
    return torch.device(acc.device_name(local_rank) if acc.device_name() == "cuda" else "cpu")

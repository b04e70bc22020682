"""`OnDevice`: build modules with their tensors on a chosen device and in a chosen dtype
(DeepSpeed's `deepspeed.OnDevice`, deepspeed/utils/init_on_device.py).

    with OnDevice(dtype=torch.bfloat16, device="meta"):
        model = MyModel()          # no weight memory allocated; shapes and dtypes only

Inside the context, torch's tensor factories (the set `with torch.device(...)` redirects:
empty, zeros, ones, full, rand, randn, arange, tensor, ...) called without a `device` make
their tensor on `device`, and floating-point tensors made without an explicit `dtype` are
in `dtype`; so are the legacy `torch.Tensor(rows, cols)` constructor's. DeepSpeed converts
the floating results of empty/zeros/ones/full even when the caller named a dtype; here an
explicit dtype is kept (a buffer asked for in fp32 stays fp32), which is the same for
parameters built by torch.nn layers (they pass none).
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

# Factories whose result is floating point whenever no dtype is given: the dtype is passed
# in, so the tensor is never made in fp32 first.
_FLOAT_BY_DEFAULT = {
    torch.empty,
    torch.empty_strided,
    torch.zeros,
    torch.ones,
    torch.rand,
    torch.randn,
    torch.eye,
    torch.linspace,
    torch.logspace,
}


class _FactoryMode(TorchFunctionMode):
    def __init__(self, device: torch.device, dtype: Optional[torch.dtype]):
        super().__init__()
        self.device, self.dtype = device, dtype
        self.factories = _device_constructors()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func not in self.factories:
            return func(*args, **kwargs)
        if kwargs.get("device") is None:
            kwargs["device"] = self.device
        explicit = kwargs.get("dtype") is not None
        if self.dtype is not None and not explicit and func in _FLOAT_BY_DEFAULT:
            kwargs["dtype"] = self.dtype
        out = func(*args, **kwargs)
        if (
            self.dtype is not None
            and not explicit
            and isinstance(out, torch.Tensor)
            and out.is_floating_point()
            and out.dtype != self.dtype
        ):
            out = out.to(self.dtype)  # torch.tensor([0.5]), torch.full(..., 1.5), arange(0.5)
        return out


class OnDevice:
    """Context manager: modules built inside have their parameters (and the buffers their
    code makes with torch's factories) on `device`, floating ones in `dtype` (None: the
    dtypes torch would pick). `enabled=False` makes it a no-op."""

    def __init__(
        self,
        dtype: Optional[torch.dtype] = None,
        device: Union[str, torch.device] = "meta",
        enabled: bool = True,
    ):
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(f"OnDevice: dtype must be a floating-point torch.dtype; got {dtype!r}")
        self.dtype = dtype
        self.device = torch.device(device)
        self.enabled = bool(enabled)
        self._mode: Optional[_FactoryMode] = None
        self._saved_new = None

    def _legacy_new(self, original):
        """torch.Tensor(*sizes) as torch.empty(*sizes), so the factory mode places it; any
        other use of the legacy constructor (data, subclasses) is left alone."""

        def new(cls, *args, **kwargs):
            sizes = args[0] if len(args) == 1 and isinstance(args[0], torch.Size) else args
            if cls is torch.Tensor and not kwargs and all(type(s) is int for s in sizes):
                return torch.empty(tuple(sizes) or (0,))
            return original(cls, *args, **kwargs)

        return new

    def __enter__(self):
        if not self.enabled:
            return self
        self._mode = _FactoryMode(self.device, self.dtype)
        self._mode.__enter__()
        self._saved_new = torch.Tensor.__dict__.get("__new__")
        torch.Tensor.__new__ = self._legacy_new(torch.Tensor.__new__)
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        if self._saved_new is None:
            del torch.Tensor.__new__  # back to the inherited constructor
        else:
            torch.Tensor.__new__ = self._saved_new
        self._mode.__exit__(*exc)
        self._mode = None
        return False

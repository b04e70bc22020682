"""DeepSpeed's flops profiler: the flops, MACs, parameters and latency of one forward, per
module, counted on torch's FlopCounterMode (counting.py, Note [Which operations count]).

A profile runs from `start_profile()` to `stop_profile()`: every forward of the model or of
one of its modules in between adds to the module's record (inclusive of its submodules);
the records stay readable (`get_total_flops`, `print_model_profile`) until `end_profile()`.
The engine profiles the forward of one step (engine/profiling.py); `get_model_profile`
profiles one call of a model outside training.
"""

from __future__ import annotations

import io
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .counting import OpTally, counter_mode
from .report import (
    duration_to_string,
    macs_to_string,
    number_to_string,
    params_to_string,
    write_aggregated_profile,
    write_model_profile,
)


@dataclass
class ModuleProfile:
    """One module's record: `flops`, `macs` and `duration` (seconds) of its forwards in the
    profile, its submodules' included; `calls`: how many forwards ran; `params`: its
    parameters, its submodules' included."""

    params: int
    flops: int = 0
    macs: int = 0
    duration: float = 0.0
    calls: int = 0


def _param_count(module: torch.nn.Module) -> int:
    # A stage-3 parameter holds only its shard between forwards; ds_numel is its whole size.
    return sum(int(getattr(p, "ds_numel", p.numel())) for p in module.parameters())


def _synchronize() -> None:
    """Module latencies on a GPU are the device's: wait for queued work before reading the
    clock. Only while a profile runs (one forward), as in DeepSpeed."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class FlopsProfiler:
    """DeepSpeed's `FlopsProfiler(model, ds_engine=None, recompute_fwd_factor=0.0)`.

    `ds_engine`: the engine whose world sizes, batch size and (with wall_clock_breakdown)
    timers the printed profile reports; `recompute_fwd_factor`: the share of the forward
    that activation checkpointing recomputes in backward (bwd flops = (2 + it) * fwd)."""

    def __init__(self, model: torch.nn.Module, ds_engine: Any = None, recompute_fwd_factor=0.0):
        self.model = model
        self.ds_engine = ds_engine
        self.recompute_fwd_factor = recompute_fwd_factor
        self.started = False  # a profile's records exist (start_profile .. end_profile)
        self.func_patched = False  # forwards are being counted (start_profile .. stop_profile)
        # What print_model_profile printed last (DeepSpeed's attributes, read by its tests).
        self.flops = 0
        self.macs = 0
        self.params = 0
        self._records: Dict[torch.nn.Module, ModuleProfile] = {}
        self._tally = OpTally()
        self._mode: Any = None
        self._handles: List[Any] = []
        self._open: Dict[torch.nn.Module, List[Tuple[int, int, float]]] = {}

    # --- the profile's life ----------------------------------------------------------------
    def start_profile(self, ignore_list: Optional[Sequence[type]] = None) -> None:
        """Starts a new profile (a running one is stopped and its records dropped). Modules
        whose type is in `ignore_list` get no record of their own: what they compute counts
        in their parent's."""
        if self.func_patched:
            self.stop_profile()
        self.reset_profile()
        ignored = tuple(ignore_list or ())
        for module in self.model.modules():
            if ignored and isinstance(module, ignored):
                continue
            self._handles.append(module.register_forward_pre_hook(self._entered))
            self._handles.append(module.register_forward_hook(self._left, always_call=True))
        # The first op under a dispatch mode imports torch._dynamo (seconds); importing it
        # here keeps that out of the first module's latency.
        import torch._dynamo  # noqa: F401

        self._mode = counter_mode(self._tally)
        self._mode.__enter__()
        self.started = True
        self.func_patched = True

    def stop_profile(self) -> None:
        """Stops counting; the records stay until end_profile()."""
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._open.clear()
        self.func_patched = False

    def reset_profile(self) -> None:
        """Zeroes every module's record (a running profile goes on counting from zero)."""
        self._records = {m: ModuleProfile(params=_param_count(m)) for m in self.model.modules()}
        self._tally.flops = self._tally.macs = 0
        self._open.clear()

    def end_profile(self) -> None:
        """Stops counting and drops the records."""
        if not self.started:
            return
        self.stop_profile()
        self.started = False
        self._records = {}

    # --- module hooks ----------------------------------------------------------------------
    def _entered(self, module: torch.nn.Module, inputs) -> None:
        _synchronize()
        start = (self._tally.flops, self._tally.macs, time.perf_counter())
        self._open.setdefault(module, []).append(start)

    def _left(self, module: torch.nn.Module, inputs, output) -> None:
        opened = self._open.get(module)
        if not opened:
            return  # the profile started inside this module's forward
        flops, macs, start = opened.pop()
        _synchronize()
        record = self._records.get(module)
        if record is None:  # a module added to the model after start_profile
            record = self._records[module] = ModuleProfile(params=_param_count(module))
        record.flops += self._tally.flops - flops
        record.macs += self._tally.macs - macs
        record.duration += time.perf_counter() - start
        record.calls += 1

    # --- reading the records ---------------------------------------------------------------
    def get_module_profile(self, module: torch.nn.Module) -> ModuleProfile:
        """`module`'s totals: what its forwards counted, or, for a module never called (a
        ModuleList, an ignored type), the sum of its submodules' (as DeepSpeed sums them)."""
        record = self._records.get(module)
        if record is None:
            return ModuleProfile(params=_param_count(module))
        if record.calls:
            return record
        total = ModuleProfile(params=record.params)
        for child in module.children():
            sub = self.get_module_profile(child)
            total.flops += sub.flops
            total.macs += sub.macs
            total.duration += sub.duration
        return total

    def get_total_flops(self, as_string: bool = False):
        flops = self.get_module_profile(self.model).flops
        return number_to_string(flops) if as_string else flops

    def get_total_macs(self, as_string: bool = False):
        macs = self.get_module_profile(self.model).macs
        return macs_to_string(macs) if as_string else macs

    def get_total_duration(self, as_string: bool = False):
        duration = self.get_module_profile(self.model).duration
        return duration_to_string(duration) if as_string else duration

    def get_total_params(self, as_string: bool = False):
        params = _param_count(self.model)
        return params_to_string(params) if as_string else params

    # --- printing --------------------------------------------------------------------------
    def print_model_profile(
        self,
        profile_step: int = 1,
        module_depth: int = -1,
        top_modules: int = 1,
        detailed: bool = True,
        output_file: Optional[str] = None,
    ) -> None:
        """Prints the summary, the aggregated profile and (`detailed`) the model tree with
        each module's profile, to `output_file` (created with its folders; overwritten) or
        stdout. Does nothing outside a profile."""
        if not self.started:
            return
        self.flops = self.get_total_flops()
        self.macs = self.get_total_macs()
        self.params = self.get_total_params()
        text = io.StringIO()
        write_model_profile(self, text, profile_step, module_depth, top_modules, detailed)
        if output_file:
            import pathlib

            path = pathlib.Path(output_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text.getvalue())
        else:
            sys.stdout.write(text.getvalue())
            sys.stdout.flush()

    def print_model_aggregated_profile(self, module_depth: int = -1, top_modules: int = 1) -> None:
        """Prints, per depth of the module tree, the `top_modules` module classes with the
        most params, MACs and latency (their modules at that depth summed)."""
        if not self.started:
            print("flops profiler: no profile to print; call this between start_profile() and "
                  "end_profile()")  # fmt: skip
            return
        write_aggregated_profile(self, sys.stdout, module_depth, top_modules)


def get_model_profile(
    model: torch.nn.Module,
    input_shape: Optional[tuple] = None,
    args: Sequence[Any] = (),
    kwargs: Optional[dict] = None,
    print_profile: bool = True,
    detailed: bool = True,
    module_depth: int = -1,
    top_modules: int = 1,
    warm_up: int = 1,
    as_string: bool = True,
    output_file: Optional[str] = None,
    ignore_modules: Optional[Sequence[type]] = None,
    mode: str = "forward",
):
    """DeepSpeed's get_model_profile: (flops, MACs, params) of one call of `model` in eval
    mode, after `warm_up` unprofiled calls. The call takes a tensor of `input_shape` (in the
    dtype and on the device of the model's first parameter) or `args`/`kwargs`; `mode`
    "generate" calls model.generate. As strings with `as_string`."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"get_model_profile: model must be a torch.nn.Module; got {type(model)}")
    if mode not in ("forward", "generate"):
        raise ValueError(f'get_model_profile: mode must be "forward" or "generate"; got {mode!r}')
    kwargs = dict(kwargs or {})
    if input_shape is not None:
        if not isinstance(input_shape, tuple) or not input_shape:
            raise ValueError(
                f"get_model_profile: input_shape must be a non-empty tuple; got {input_shape!r}"
            )
        first = next(model.parameters(), None)
        dtype = None if first is None else first.dtype
        device = None if first is None else first.device
        args = [torch.zeros(input_shape, dtype=dtype, device=device)]
    if not args and not kwargs:
        raise ValueError("get_model_profile: give input_shape, or args and/or kwargs")
    call: Callable[..., Any] = model.generate if mode == "generate" else model  # type: ignore[assignment]
    model.eval()
    for _ in range(warm_up):
        call(*args, **kwargs)
    profiler = FlopsProfiler(model)
    profiler.start_profile(ignore_list=ignore_modules)
    try:
        call(*args, **kwargs)
        flops = profiler.get_total_flops()
        macs = profiler.get_total_macs()
        params = profiler.get_total_params()
        if print_profile:
            profiler.print_model_profile(
                profile_step=warm_up,
                module_depth=module_depth,
                top_modules=top_modules,
                detailed=detailed,
                output_file=output_file,
            )
    finally:
        profiler.end_profile()
    if as_string:
        return number_to_string(flops), macs_to_string(macs), params_to_string(params)
    return flops, macs, params

"""The flops profiler's text: DeepSpeed's number formats (`number_to_string` and its
`*_to_string` kin: two decimals, SI prefixes) and the printed profile (summary, aggregated
profile per depth, the model tree with each module's numbers)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, TextIO

import torch

from .timers import BACKWARD_GLOBAL_TIMER, FORWARD_GLOBAL_TIMER, STEP_GLOBAL_TIMER

# The writers below read a FlopsProfiler (flops_profiler.py, which imports this module):
# its model, ds_engine, recompute_fwd_factor, get_module_profile and get_total_*.
FlopsProfiler = Any

DEFAULT_PRECISION = 2
_PREFIXES = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3), ("", 1.0), ("m", 1e-3), ("u", 1e-6))


def number_to_string(num, units: Optional[str] = None, precision: int = DEFAULT_PRECISION) -> str:
    """`num` scaled to an SI prefix ("T" .. "u"; chosen by size unless `units` names one)
    and rounded: `number_to_string(1234567)` is "1.23 M", `number_to_string(0)` "0 "."""
    if units is None:
        if num == 0:
            units = ""
        else:
            units = next((p for p, scale in _PREFIXES if abs(num) >= scale), "u")
    scale = dict(_PREFIXES).get(units, 1.0)
    return f"{round(num / scale, precision):g} {units}"


def flops_to_string(flops, units: Optional[str] = None, precision: int = DEFAULT_PRECISION) -> str:
    return f"{number_to_string(flops, units, precision)}FLOPS"


def macs_to_string(macs, units: Optional[str] = None, precision: int = DEFAULT_PRECISION) -> str:
    return f"{number_to_string(macs, units, precision)}MACs"


def bytes_to_string(b, units: Optional[str] = None, precision: int = DEFAULT_PRECISION) -> str:
    return f"{number_to_string(b, units, precision)}B"


def duration_to_string(duration, units: Optional[str] = None, precision=DEFAULT_PRECISION) -> str:
    return f"{number_to_string(duration, units, precision)}s"


def params_to_string(params_num, units: Optional[str] = None, precision=DEFAULT_PRECISION) -> str:
    """Parameter counts say "B" (billions) where the others say "G": "1.5 B", "110"."""
    giga = units.replace("B", "G") if units else units
    return number_to_string(params_num, giga, precision).replace("G", "B").strip()


def _banner(title: str) -> str:
    return f"\n{' ' + title + ' ':-^86}\n"


def _percent(part, whole) -> str:
    return f"{round(100 * part / whole, DEFAULT_PRECISION) if whole else 0:g}%"


def _line(out: TextIO, label: str, value: Any) -> None:
    out.write(f"{label:<70}  {value}\n")


def _engine_lines(profiler: FlopsProfiler, out: TextIO) -> None:
    engine = profiler.ds_engine
    _line(out, "world size:", engine.world_size)
    # Under sequence parallelism (Ulysses) DeepSpeed's engine has no data-parallel size of
    # its own: its sequence-data-parallel group replicates the model.
    dp = engine.dp_world_size
    if dp is None:
        dp = getattr(engine, "seq_dp_world_size", None)
    _line(out, "data parallel size:", dp)
    _line(out, "model parallel size:", engine.mp_world_size)
    _line(out, "batch size per GPU:", engine.train_micro_batch_size_per_gpu())


def _timer_seconds(engine, name: str) -> float:
    return engine.timers(name).elapsed(reset=False) / 1000.0


def _rate(flops, seconds) -> str:
    return flops_to_string(flops / seconds if seconds else 0)


def write_summary(profiler: FlopsProfiler, out: TextIO, profile_step: int) -> None:
    engine = profiler.ds_engine
    mp = engine.mp_world_size if engine is not None else 1
    flops, macs = profiler.get_total_flops(), profiler.get_total_macs()
    params = profiler.get_total_params()
    out.write(_banner("Flops Profiler"))
    out.write(f"Profile Summary at step {profile_step}:\n")
    out.write(
        "Notations:\ndata parallel size (dp_size), model parallel size (mp_size),\n"
        "number of parameters (params), number of multiply-accumulate operations (MACs),\n"
        "number of floating-point operations (flops), floating-point operations per second "
        "(FLOPS),\nfwd latency (forward propagation latency), bwd latency (backward "
        "propagation latency),\nstep (weights update latency), iter latency (sum of fwd, bwd "
        "and step latency)\n\n"
    )
    if engine is not None:
        _engine_lines(profiler, out)
    _line(out, "params per GPU:", params_to_string(params))
    _line(out, "params of model = params per GPU * mp_size:", params_to_string(params * mp))
    _line(out, "fwd MACs per GPU:", macs_to_string(macs))
    _line(out, "fwd flops per GPU:", number_to_string(flops))
    _line(out, "fwd flops of model = fwd flops per GPU * mp_size:", number_to_string(flops * mp))
    timed = engine is not None and engine.wall_clock_breakdown()
    fwd = _timer_seconds(engine, FORWARD_GLOBAL_TIMER) if timed else profiler.get_total_duration()
    _line(out, "fwd latency:", duration_to_string(fwd))
    _line(out, "fwd FLOPS per GPU = fwd flops per GPU / fwd latency:", _rate(flops, fwd))
    if not timed:
        return
    factor = 2 + profiler.recompute_fwd_factor
    bwd = _timer_seconds(engine, BACKWARD_GLOBAL_TIMER)
    step = _timer_seconds(engine, STEP_GLOBAL_TIMER)
    _line(out, "bwd latency:", duration_to_string(bwd))
    _line(
        out,
        f"bwd FLOPS per GPU = {factor:g} * fwd flops per GPU / bwd latency:",
        _rate(factor * flops, bwd),
    )
    _line(
        out,
        f"fwd+bwd FLOPS per GPU = {factor + 1:g} * fwd flops per GPU / (fwd+bwd latency):",
        _rate((factor + 1) * flops, fwd + bwd),
    )
    _line(out, "step latency:", duration_to_string(step))
    iteration = fwd + bwd + step
    _line(out, "iter latency:", duration_to_string(iteration))
    _line(
        out,
        f"FLOPS per GPU = {factor + 1:g} * fwd flops per GPU / iter latency:",
        _rate((factor + 1) * flops, iteration),
    )
    samples = engine.train_micro_batch_size_per_gpu() * engine.world_size
    _line(out, "samples/second:", round(samples / iteration, DEFAULT_PRECISION) if iteration else 0)


def write_aggregated_profile(
    profiler: FlopsProfiler, out: TextIO, module_depth: int, top_modules: int
) -> None:
    """Per depth (0: the model), the module classes summed over their modules there, the
    top `top_modules` by params, MACs and latency. `module_depth` -1: every depth."""
    by_depth: List[Dict[str, List[float]]] = []

    def walk(module: torch.nn.Module, depth: int) -> None:
        if depth == len(by_depth):
            by_depth.append({})
        p = profiler.get_module_profile(module)
        sums = by_depth[depth].setdefault(type(module).__name__, [0, 0, 0.0])
        sums[0] += p.params
        sums[1] += p.macs
        sums[2] += p.duration
        for child in module.children():
            walk(child, depth + 1)

    walk(profiler.model, 0)
    depths = len(by_depth) if module_depth == -1 else min(module_depth, len(by_depth))
    out.write(
        f"Top {top_modules} modules in terms of params, MACs or fwd latency at different "
        "model depths:\n"
    )
    formats = (params_to_string, macs_to_string, duration_to_string)
    for depth in range(depths):
        out.write(f"depth {depth}:\n")
        for label, i in (("params     ", 0), ("MACs       ", 1), ("fwd latency", 2)):
            ranked = sorted(by_depth[depth].items(), key=lambda kv: kv[1][i], reverse=True)
            top = {name: formats[i](v[i]) for name, v in ranked[:top_modules]}
            out.write(f"    {label} - {top}\n")


def _module_items(profiler: FlopsProfiler, module: torch.nn.Module, totals) -> str:
    p = profiler.get_module_profile(module)
    params, macs, duration = totals
    items = [
        f"{params_to_string(p.params)} = {_percent(p.params, params)} Params",
        f"{macs_to_string(p.macs)} = {_percent(p.macs, macs)} MACs",
        f"{duration_to_string(p.duration)} = {_percent(p.duration, duration)} latency",
        flops_to_string(round(p.flops / p.duration, DEFAULT_PRECISION) if p.duration else 0),
    ]
    own = module.extra_repr()
    if own:
        items.append(own)
    return ", ".join(items)


def _write_tree(profiler, out: TextIO, module, name: Optional[str], indent: int, totals) -> None:
    pad = "  " * indent
    head = f"{pad}({name}): " if name is not None else pad
    items = _module_items(profiler, module, totals)
    children = list(module.named_children())
    if not children:
        out.write(f"{head}{type(module).__name__}({items})\n")
        return
    out.write(f"{head}{type(module).__name__}(\n{pad}  {items}\n")
    for child_name, child in children:
        _write_tree(profiler, out, child, child_name, indent + 1, totals)
    out.write(f"{pad})\n")


def write_model_profile(
    profiler: FlopsProfiler,
    out: TextIO,
    profile_step: int,
    module_depth: int,
    top_modules: int,
    detailed: bool,
) -> None:
    write_summary(profiler, out, profile_step)
    out.write(_banner("Aggregated Profile per GPU"))
    write_aggregated_profile(profiler, out, module_depth, top_modules)
    if detailed:
        out.write(_banner("Detailed Profile per GPU"))
        out.write(
            "Each module's profile follows its name: params, percentage of total params, "
            "MACs, percentage of total MACs, fwd latency, percentage of total fwd latency, "
            "fwd FLOPS\n\nNotes: a module's numbers include its submodules'; what a module "
            "computes outside its submodules (a functional call, a loss) makes up the "
            "difference between the parent's and the sum of its submodules'. Flops are an "
            "estimate from each operation's shapes, so FLOPS can exceed what the hardware "
            "sustains. The top module's latency is measured around its forward alone.\n\n"
        )
        root = profiler.get_module_profile(profiler.model)
        totals = (root.params, root.macs, root.duration)
        _write_tree(profiler, out, profiler.model, None, 0, totals)
    out.write("------------------------------------------------------------------------------\n")

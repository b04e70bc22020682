"""`zerostream estimate`: memory and step-time plan of every ZeRO option for a model on a
machine, the recommended option and (--write-config) its ds_config.json; DeepSpeed's
model-states tables beside it. add_parser() adds the subcommand to the zerostream CLI."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import shutil
import sys
from typing import List, Optional

from . import zero_estimators as ds
from .machine import DEFAULTS, build_machine
from .model import ModelShape, assumed_shape, load_hf_config
from .plan import (
    Option,
    Prediction,
    Workload,
    best,
    knobs_from_config,
    predict,
    predict_all,
)
from .recommend import ds_config, explain, format_config, time_note
from .units import GB, gb, parse_count, parse_rate, parse_size, seconds

RATE_FLAGS = {
    "nvme_read": "--nvme-read-gbps",
    "nvme_write": "--nvme-write-gbps",
    "pcie": "--pcie-gbps",
    "cpu_adam": "--cpu-adam-gparams",
    "collective": "--collective-gbps",
    "net": "--net-gbps",
    "collective_latency_us": "--collective-latency-us",
    "net_latency_us": "--net-latency-us",
    "peak_tflops": "--peak-tflops",
}


class UsageError(ValueError):
    """Bad input: printed as `zerostream estimate: error: ...`, exit code 2."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("model (one of --params, --model-config; both: the count wins)")
    m.add_argument("--params", help="parameter count: 70B, 1.3B, 350M, 7e10")
    m.add_argument(
        "--model-config",
        metavar="JSON",
        help="a Hugging Face config.json (hidden_size, num_hidden_layers, num_attention_heads, "
        "vocab_size, intermediate_size; or GPT-2's n_embd, n_layer, n_head, n_positions)",
    )
    h = p.add_argument_group("machine")
    h.add_argument("--gpus", type=int, default=1, help="GPUs (processes) per node (default 1)")
    h.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    h.add_argument("--gpu-mem", default="80GB", help="memory per GPU (default 80GB)")
    h.add_argument("--cpu-mem", help="host RAM per node (default: this machine's)")
    h.add_argument(
        "--nvme", help="NVMe space per node (default: free space at --nvme-path, else 0)"
    )
    h.add_argument(
        "--nvme-path",
        default="/local_nvme",
        help="where offloaded state goes; written into the config (default /local_nvme)",
    )
    h.add_argument(
        "--cpu-only",
        action="store_true",
        help="no GPU: the processes train on the CPU (memory is all host memory)",
    )
    for name, flag in RATE_FLAGS.items():
        value, unit, why = DEFAULTS[name]
        h.add_argument(flag, help=f"{unit} (default {value}, {why})")
    h.add_argument(
        "--measured",
        action="append",
        default=[],
        metavar="JSON",
        help="rates measured here: the JSON of `zerostream bench io|optim|step --json`",
    )
    h.add_argument(
        "--no-cache",
        action="store_true",
        help="ignore measurements in $ZEROSTREAM_CACHE_DIR (default ~/.cache/zerostream)",
    )
    h.add_argument("--host-overhead", help="host memory per process beyond the model's tensors")
    h.add_argument("--gpu-reserve", help="GPU memory for CUDA context and allocator slack")
    w = p.add_argument_group("run")
    w.add_argument("--micro-batch", type=int, default=1, help="sequences per GPU per micro-step")
    w.add_argument("--seq", type=int, help="sequence length (default 4096, or n_positions)")
    w.add_argument("--grad-accum", type=int, default=1, help="micro-steps per optimizer step")
    w.add_argument(
        "--precision",
        choices=("auto", "bf16", "fp16", "fp32"),
        default="auto",
        help="auto: bf16 with GPUs, fp32 with --cpu-only",
    )
    w.add_argument(
        "--bf16-master-weights",
        action="store_true",
        help="bf16.bf16_master_weights_and_grads: bf16 master weights (2 B, not 4)",
    )
    w.add_argument(
        "--bf16-optimizer-states",
        action="store_true",
        help="bf16.bf16_optimizer_states: bf16 Adam moments (4 B, not 8); needs "
        "--bf16-master-weights",
    )
    w.add_argument(
        "--no-activation-checkpointing",
        action="store_true",
        help="size activations without per-layer checkpointing",
    )
    o = p.add_argument_group("output")
    o.add_argument(
        "--ds-config",
        metavar="JSON",
        help="plan this ds_config only (its stage, offload and bucket settings)",
    )
    o.add_argument("--write-config", metavar="PATH", help="write the recommended ds_config here")
    o.add_argument(
        "--with-comment",
        action="store_true",
        help="start the written config with // lines (the plan and the command); hjson, which "
        "DeepSpeed and zerostream read but plain json.load (HF's HfDeepSpeedConfig) does not",
    )
    o.add_argument("--json", action="store_true", help="print one JSON object")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Adds `estimate` to the zerostream CLI's subparsers."""
    p = subparsers.add_parser(
        "estimate",
        help="memory needs and a recommended config for a model on a machine",
        description=__doc__.splitlines()[0],
    )
    add_arguments(p)
    p.set_defaults(func=run)
    return p


# --- from arguments to the planner's inputs ---------------------------------------------------


def _positive(args, name: str) -> int:
    value = getattr(args, name)
    if value is None or value < 1:
        raise UsageError(f"--{name.replace('_', '-')}: expected a count >= 1; got {value}")
    return value


def _shape(args) -> ModelShape:
    if not args.params and not args.model_config:
        raise UsageError("give the model: --params COUNT (e.g. 70B) or --model-config JSON")
    count = parse_count(args.params, "--params") if args.params else None
    if args.model_config:
        shape = load_hf_config(args.model_config)
        if count:
            shape = dataclasses.replace(shape, params_override=count)
        return shape
    return assumed_shape(count)


def _machine(args):
    import psutil

    cpu_mem = (
        parse_size(args.cpu_mem, "--cpu-mem")
        if args.cpu_mem
        else int(psutil.virtual_memory().total)
    )
    if args.nvme:
        nvme = parse_size(args.nvme, "--nvme")
    else:
        nvme = shutil.disk_usage(args.nvme_path).free if os.path.isdir(args.nvme_path) else 0
    flags = {
        name: parse_rate(getattr(args, flag[2:].replace("-", "_")), flag)
        for name, flag in RATE_FLAGS.items()
        if getattr(args, flag[2:].replace("-", "_")) is not None
    }
    return build_machine(
        gpus_per_node=_positive(args, "gpus"),
        nodes=_positive(args, "nodes"),
        gpu_mem=parse_size(args.gpu_mem, "--gpu-mem"),
        cpu_mem=cpu_mem,
        nvme=nvme,
        cpu_only=args.cpu_only,
        flags=flags,
        measured=args.measured,
        use_cache=not args.no_cache,
        host_overhead=parse_size(args.host_overhead, "--host-overhead")
        if args.host_overhead
        else None,
        gpu_reserve=parse_size(args.gpu_reserve, "--gpu-reserve") if args.gpu_reserve else None,
    )


def _workload(args, shape: ModelShape, cfg=None) -> Workload:
    seq = args.seq or (min(4096, shape.positions) if shape.positions else 4096)
    if seq < 1:
        raise UsageError(f"--seq: expected a length >= 1; got {seq}")
    if shape.positions and seq > shape.positions:
        raise UsageError(
            f"--seq {seq} exceeds the model's {shape.positions} learned positions (n_positions)"
        )
    precision = args.precision
    micro, accum = _positive(args, "micro_batch"), _positive(args, "grad_accum")
    master, states = args.bf16_master_weights, args.bf16_optimizer_states
    if cfg is not None:  # the config decides what it sets
        precision = cfg.precision
        micro = cfg.train_micro_batch_size_per_gpu or micro
        accum = cfg.gradient_accumulation_steps or accum
        master = cfg.bf16.enabled and cfg.bf16.bf16_master_weights_and_grads
        states = master and cfg.bf16.bf16_optimizer_states
    if precision == "auto":
        precision = "fp32" if args.cpu_only else "bf16"
    if states and not master:
        raise UsageError("--bf16-optimizer-states: needs --bf16-master-weights")
    if master and precision != "bf16":
        raise UsageError(f"--bf16-master-weights: needs --precision bf16; got {precision}")
    return Workload(
        micro, seq, accum, precision, not args.no_activation_checkpointing, master, states
    )


def _plan(args):
    shape = _shape(args)
    machine = _machine(args)
    if args.ds_config:
        from ..config import load

        try:
            cfg = load(args.ds_config, world_size=machine.world, require_batch=False, log=False)
        except ValueError as exc:
            raise UsageError(f"--ds-config: {exc}") from exc
        work = _workload(args, shape, cfg)
        z = cfg.zero_optimization
        ext = cfg.zerostream
        knobs = knobs_from_config(
            z, ext.optimizer_max_in_cpu, ext.device_tier_grads, ext.optimizer_max_on_device
        )
        device_tier = knobs.offload_ratio < 1.0 or knobs.optimizer_max_on_device > 0
        option = Option(
            z.stage,
            z.offload_optimizer_device,
            z.offload_param_device,
            gpu_tier=device_tier and z.offload_optimizer_device != "none",
        )
        preds = [predict(shape, work, machine, option, knobs)]
    else:
        work = _workload(args, shape)
        preds = predict_all(shape, work, machine)
    return shape, machine, work, preds


# --- output ----------------------------------------------------------------------------------


def _ds_tables(shape: ModelShape, machine) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        g, n = machine.gpus_per_node, machine.nodes
        ds.estimate_zero2_model_states_mem_needs_all_cold(shape.params, g, n)
        ds.estimate_zero3_model_states_mem_needs_all_cold(
            shape.params, shape.largest_layer_params, g, n
        )
    return out.getvalue()


def _group(terms: dict, names) -> int:
    return sum(v for k, v in terms.items() if k in names)


def _memory_table(preds: List[Prediction], machine) -> List[str]:
    where = "process" if machine.cpu_only else "GPU"
    head = (
        f"{'option':46s} {'params':>7s} {'optim':>7s} {'activ':>7s} {'buffers':>7s} "
        f"{'peak':>7s} | {'host':>7s} {'NVMe':>7s} | fits"
    )
    lines = [
        f"memory, GB: per {where} (params, optimizer states on the {where}, activations with "
        f"loss, buffers = buckets + gathered params + step temporaries, peak); per node "
        f"(host, NVMe)",
        head,
    ]
    for p in preds:
        dev = {**p.device}
        params = sum(v for k, v in dev.items() if "param" in k)
        optim = sum(dev.values()) - params
        act = _group(p.backward, ("activations", "layer backward", "logits/loss"))
        buffers = p.device_peak - params - optim - act
        fits = "yes" if p.fits else "no: " + "; ".join(p.problems)
        lines.append(
            f"{p.option.label:46s} {gb(params):>7s} {gb(optim):>7s} {gb(act):>7s} "
            f"{gb(buffers):>7s} {gb(p.device_peak):>7s} | {gb(p.host_node):>7s} "
            f"{gb(p.nvme_node):>7s} | {fits}"
        )
    return lines


def _time_table(preds: List[Prediction]) -> List[str]:
    links = list(preds[0].seconds)
    lines = [
        "step time lower bound, s: bytes each link moves per step / its rate; the step is "
        "at least the slowest",
        f"{'option':46s} " + " ".join(f"{k:>10s}" for k in links) + f" {'step >=':>9s}  bound",
    ]
    for p in preds:
        cells = " ".join(f"{seconds(p.seconds[k]):>10s}" for k in links)
        lines.append(f"{p.option.label:46s} {cells} {seconds(p.step_seconds):>9s}  {p.bound_by}")
    return lines


LINK_WORK = {  # seconds key -> (what it moves per step, its traffic keys, unit)
    "compute": ("FLOPs per GPU", ("flops",), 1e12, "T"),
    "nvme": ("bytes per node", ("nvme_read", "nvme_write"), GB, "GB"),
    "cpu_adam": ("params per node", ("cpu_adam",), 1e9, "G"),
    "intra": ("bytes per GPU over the intra-node link", ("intra",), GB, "GB"),
    "net": ("bytes per node over the network", ("net",), GB, "GB"),
    "pcie": ("bytes per GPU, the busier way", ("h2d", "d2h"), GB, "GB"),
}


def link_lines(p: Prediction) -> List[str]:
    """What each link of one option carries per step, its seconds and its share of the step
    bound (the slowest link is 100%: the others hide under it if they overlap)."""
    lines = []
    for name, secs in p.seconds.items():
        what, keys, scale, unit = LINK_WORK[name]
        moved = [p.traffic.get(k, 0.0) for k in keys]
        amount = max(moved) if name == "pcie" else sum(moved)
        share = secs / p.step_seconds if p.step_seconds else 0.0
        lines.append(
            f"{name:9s} {amount / scale:10.2f} {unit:2s} {what}: {seconds(secs)} s "
            f"({100 * share:.0f}% of the step bound)"
        )
    return lines


def _to_json(p: Prediction) -> dict:
    return {
        "stage": p.option.stage,
        "offload_optimizer": p.option.optimizer,
        "offload_param": p.option.param,
        "label": p.option.label,
        "device_bytes": p.device,
        "backward_bytes": p.backward,
        "step_bytes": p.step,
        "device_peak_bytes": p.device_peak,
        "host_bytes_per_process": p.host,
        "process_rss_bytes": p.process_rss,
        "host_bytes_per_node": p.host_node,
        "nvme_bytes_per_process": p.nvme,
        "nvme_bytes_per_node": p.nvme_node,
        "traffic_per_step": p.traffic,
        "seconds": p.seconds,
        "step_seconds_lower_bound": p.step_seconds,
        "bound_by": p.bound_by,
        "link_share": {
            k: (v / p.step_seconds if p.step_seconds else 0.0) for k, v in p.seconds.items()
        },
        "fits": p.fits,
        "problems": p.problems,
        "knobs": p.knobs.__dict__,
    }


def _command(args, shape: ModelShape, machine, work: Workload) -> str:
    """The estimate command that reproduces this plan, with the resolved values."""
    parts = ["zerostream estimate"]
    if args.model_config:
        parts.append(f"--model-config {os.path.basename(args.model_config)}")
    if args.params or not args.model_config:
        parts.append(f"--params {args.params}")
    parts.append(f"--gpus {machine.gpus_per_node} --nodes {machine.nodes}")
    if machine.cpu_only:
        parts.append("--cpu-only")
    else:
        parts.append(f"--gpu-mem {machine.gpu_mem / GB:g}GB")
    parts.append(f"--cpu-mem {machine.cpu_mem / GB:g}GB --nvme {machine.nvme / GB:g}GB")
    for name, flag in RATE_FLAGS.items():
        if machine.rates[name].source == "flag":
            parts.append(f"{flag} {machine.rate(name):g}")
    parts.append(f"--micro-batch {work.micro_batch} --seq {work.seq}")
    if work.grad_accum != 1:
        parts.append(f"--grad-accum {work.grad_accum}")
    if args.precision != "auto":
        parts.append(f"--precision {work.precision}")
    if not work.checkpointing:
        parts.append("--no-activation-checkpointing")
    if args.nvme_path != "/local_nvme":
        parts.append(f"--nvme-path {args.nvme_path}")
    return " ".join(parts)


def _write(path: str, cfg: dict, world: int, comment: List[str]) -> dict:
    from ..config_check import check

    with open(path, "w", encoding="utf-8") as f:
        f.write(format_config(cfg, comment))
    res = check(path, world_size=world)
    return {"path": path, "ok": res["ok"], "errors": res["errors"], "warnings": res["warnings"]}


def plan(args) -> dict:
    """Everything `zerostream estimate` prints, as one dict (the --json output)."""
    shape, machine, work, preds = _plan(args)
    rec = best(preds)
    result = {
        "model": {
            "description": shape.describe(),
            "params": shape.params,
            "largest_layer_params": shape.largest_layer_params,
            "assumptions": list(shape.assumptions),
        },
        "machine": {
            "description": machine.describe(),
            "world_size": machine.world,
            "rates": {k: r.__dict__ for k, r in machine.rates.items()},
            "host_overhead_bytes": machine.host_overhead,
            "gpu_reserve_bytes": machine.gpu_reserve,
            "host_usable_bytes": machine.host_usable,
        },
        "run": work.__dict__,
        "options": [_to_json(p) for p in preds],
        "recommended": None if rec is None else _to_json(rec),
        "why": [] if args.ds_config else explain(preds, rec, shape, work, machine),
        "time": None if rec is None else time_note(rec, work),
        "deepspeed_tables": _ds_tables(shape, machine),
        "written": None,
        "_predictions": preds,
        "_recommended": rec,
    }
    if args.write_config:
        if rec is None:
            raise UsageError("--write-config: no option fits, so there is no config to write")
        cfg = ds_config(rec, shape, work, args.nvme_path)
        comment = []
        if args.with_comment:
            comment = [
                f"{rec.option.label} for {shape.describe()} on {machine.describe()}: "
                f"{work.precision}, micro batch {work.micro_batch} x {work.seq} tokens.",
                *(f"{line}." for line in result["why"]),
                f"{time_note(rec, work, others=False)}.",
                f"Written by: {_command(args, shape, machine, work)}",
                f"Set nvme_path to a directory on a local NVMe drive ({args.nvme_path} here)."
                if "nvme" in (rec.option.optimizer, rec.option.param)
                else "",
            ]
        result["written"] = _write(args.write_config, cfg, machine.world, [c for c in comment if c])
    return result


def _print(res: dict, args) -> None:
    m, preds, rec = res["machine"], res["_predictions"], res["_recommended"]
    run = res["run"]
    print("zerostream estimate (GB = 10^9 bytes)")
    print(f"model:   {res['model']['description']}")
    for a in res["model"]["assumptions"]:
        print(f"         assumption: {a}")
    print(f"machine: {m['description']}")
    print(
        f"run:     {run['precision']}, micro batch {run['micro_batch']} x {run['seq']} tokens, "
        f"gradient accumulation {run['grad_accum']}, activation checkpointing "
        f"{'on' if run['checkpointing'] else 'off'}"
    )
    for name, r in m["rates"].items():
        print(f"rate:    {name:12s} {r['value']:g} {r['unit']} [{r['source']}]")
    print(
        f"assumed: {gb(m['host_overhead_bytes'])} GB host memory per process beyond tensors"
        + ("" if args.cpu_only else f", {gb(m['gpu_reserve_bytes'])} GB per GPU reserved")
        + f", {gb(m['host_usable_bytes'])} GB of host RAM usable per node (5% kept free)"
    )
    print()
    print("\n".join(_memory_table(preds, res["_predictions"][0].machine)))
    print()
    print("\n".join(_time_table(preds)))
    print()
    if res["why"]:
        print("why:")
        for line in res["why"]:
            print(f"  - {line}")
    if rec is not None:
        print(f"recommended: {rec.option.label}: {res['time']}")
        print("  links per step:")
        for line in link_lines(rec):
            print(f"    {line}")
    else:
        print("recommended: none fits")
    if res["written"]:
        w = res["written"]
        verdict = "ok" if w["ok"] else "INVALID: " + "; ".join(w["errors"])
        print(
            f"wrote {w['path']} (zerostream config check --world-size {m['world_size']}: {verdict})"
        )
    print()
    print("DeepSpeed's estimators (model states only; GB here = 2^30 bytes, as DeepSpeed prints):")
    print(res["deepspeed_tables"], end="")


def run(args) -> int:
    try:
        res = plan(args)
    except ValueError as exc:  # bad input: UsageError, parse errors, config key errors
        print(f"zerostream estimate: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"zerostream estimate: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = {k: v for k, v in res.items() if not k.startswith("_")}
        print(json.dumps(out, indent=2))
    else:
        _print(res, args)
    written = res["written"]
    return 1 if written and not written["ok"] else 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="zerostream estimate", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

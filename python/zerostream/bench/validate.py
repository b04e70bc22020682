"""The planner against reality: `python -m zerostream.bench.validate` trains a GPT with
`zerostream bench step` (one process on this machine's CPU, fp32, as bench step runs there)
under several ZeRO options and prints, per option, the planner's predicted peak RSS and NVMe
bytes per step beside the measured ones (benchmarks/estimate.md).

The process overhead the planner adds to the tensors (torch, Python, libraries) is measured
first, by the same benchmark on a GPT of 15 K parameters, so that what is compared is the
model's own accounting. Each configuration is the benchmark's (DeepSpeed's defaults), with
offloaded param shards all on disk (max_in_cpu 0); the planner reads the same file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

from ..estimate.machine import build_machine
from ..estimate.model import ModelShape, from_hf_config
from ..estimate.plan import Knobs, Option, Prediction, Workload, predict
from ..estimate.units import GIB

TINY = {"layers": 1, "hidden": 32, "heads": 2, "vocab": 64, "seq": 16}
DEFAULT_OPTIONS = ("2/none/none", "2/cpu/none", "2/nvme/none", "3/cpu/cpu", "3/nvme/nvme")
# bench step's traffic tiers -> the planner's traffic keys
TIERS = {
    "nvme_read": "optimizer_nvme_read",
    "nvme_write": "optimizer_nvme_write",
    "param_nvme_read": "param_nvme_read",
    "param_nvme_write": "param_nvme_write",
}


def parse_option(text: str) -> Option:
    """'3/nvme/nvme' -> Option(3, 'nvme', 'nvme') (stage/optimizer/params)."""
    try:
        stage, opt, param = text.split("/")
        option = Option(int(stage), opt, param)
    except ValueError:
        raise ValueError(
            f"--options: expected STAGE/OPTIMIZER/PARAMS like 3/cpu/cpu; got {text!r}"
        ) from None
    devices = ("none", "cpu", "nvme")
    if option.stage not in (1, 2, 3) or opt not in devices or param not in devices:
        raise ValueError(f"--options: {text!r}: stage 1-3, devices none|cpu|nvme")
    if option.stage < 3 and param != "none":
        raise ValueError(f"--options: {text!r}: only stage 3 offloads params")
    return option


def gpt_shape(shape: Dict[str, int]) -> ModelShape:
    """bench/gpt.py's GPT as the planner sees it: GPT-2 style, tied head, learned positions
    (as many as the sequence)."""
    return from_hf_config(
        {
            "model_type": "gpt2",
            "n_embd": shape["hidden"],
            "n_layer": shape["layers"],
            "n_head": shape["heads"],
            "vocab_size": shape["vocab"],
            "n_positions": shape["seq"],
        },
        "bench GPT",
    )


def bench_config(option: Option, nvme_path: str) -> dict:
    """The ds_config `zerostream bench step` builds for these flags, max_in_cpu 0 added."""
    zero: dict = {"stage": option.stage}
    if option.optimizer != "none":
        zero["offload_optimizer"] = {"device": option.optimizer}
        if option.optimizer == "nvme":
            zero["offload_optimizer"]["nvme_path"] = nvme_path
    if option.param != "none":
        zero["offload_param"] = {"device": option.param}
        if option.param == "nvme":
            zero["offload_param"].update(nvme_path=nvme_path, max_in_cpu=0)
    return {
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
        "zero_optimization": zero,
        "bf16": {"enabled": False},
    }


def bench(shape: Dict[str, int], micro: int, config_path: str, steps: int, warmup: int) -> dict:
    """One `zerostream bench step` run (the zerostream peer only); its peer's result."""
    from . import step

    p = argparse.ArgumentParser()
    step.add_arguments(p)
    argv = [f"--{k}={v}" for k, v in shape.items()]
    argv += [f"--micro-batch={micro}", f"--config={config_path}", "--peers=zerostream"]
    argv += [f"--steps={steps}", f"--warmup={warmup}", "--json"]
    res = step.measure(p.parse_args(argv))["peers"]["zerostream"]
    if "error" in res:
        raise RuntimeError(f"bench step failed: {res['error']}")
    return res


def measure_overhead(workdir: str) -> int:
    """Peak RSS of a bench step process training a 15 K-parameter GPT (stage 2, no
    offload): the process overhead the planner adds to the model's tensors."""
    path = os.path.join(workdir, "overhead.json")
    with open(path, "w") as f:
        json.dump(bench_config(Option(2, "none", "none"), workdir), f)
    return int(bench(TINY, 1, path, steps=2, warmup=1)["peak_rss_bytes"])


def predict_run(
    shape: Dict[str, int], micro: int, option: Option, config_path: str, overhead: int
) -> Prediction:
    """The planner's prediction for one bench step run: one CPU process, fp32, no
    activation checkpointing, the config file's knobs."""
    return predict_cpu_run(shape, config_path, option, micro=micro, overhead=overhead)


def predict_cpu_run(
    shape: Dict[str, int],
    config,
    option: Option,
    micro: Optional[int] = None,
    nodes: int = 1,
    nproc: int = 1,
    overhead: Optional[int] = None,
    rates: Optional[Dict[str, float]] = None,
) -> Prediction:
    """The planner's prediction for bench/gpt.py's GPT of `shape` trained by nodes x nproc
    CPU processes under `config` (a ds_config dict or path; its knobs, its micro batch
    unless `micro` is given, its gradient accumulation), without activation
    checkpointing; `rates`: planner rates by name, as the command's flags give them."""
    from ..config import load

    cfg = load(config, world_size=nodes * nproc, require_batch=False, log=False)
    micro = micro or cfg.train_micro_batch_size_per_gpu
    accum = cfg.gradient_accumulation_steps or 1
    machine = build_machine(
        gpus_per_node=nproc,
        nodes=nodes,
        gpu_mem=0,
        cpu_mem=2**50,
        nvme=2**50,
        cpu_only=True,
        use_cache=False,
        host_overhead=overhead,
        flags=rates,
    )
    work = Workload.from_config(cfg, micro, shape["seq"], accum, checkpointing=False)
    knobs = Knobs.from_config(cfg)
    return predict(gpt_shape(shape), work, machine, option, knobs)


def compare(
    shape: Dict[str, int],
    micro: int,
    options: Sequence[Option],
    overhead: Optional[int] = None,
    steps: int = 2,
    warmup: int = 1,
    nvme_path: Optional[str] = None,
) -> dict:
    """Measured and predicted peak RSS and NVMe bytes per step, per option."""
    with tempfile.TemporaryDirectory(prefix="zs-estimate-") as tmp:
        nvme = nvme_path or os.path.join(tmp, "nvme")
        source = "given"
        if overhead is None:
            overhead, source = measure_overhead(tmp), "measured"
        rows = []
        for option in options:
            path = os.path.join(tmp, f"s{option.stage}_{option.optimizer}_{option.param}.json")
            with open(path, "w") as f:
                json.dump(bench_config(option, nvme), f)
            pred = predict_run(shape, micro, option, path, overhead)
            got = bench(shape, micro, path, steps, warmup)
            traffic = {
                tier: (pred.traffic.get(key, 0.0), got["bytes_per_step"].get(tier, 0))
                for tier, key in TIERS.items()
                if pred.traffic.get(key) or got["bytes_per_step"].get(tier)
            }
            rows.append(
                {
                    "option": option.label,
                    "rss": (pred.process_rss, got["peak_rss_bytes"]),
                    "traffic": traffic,
                    "step_seconds": got["median_step_seconds"],
                }
            )
    return {
        "shape": shape,
        "params": gpt_shape(shape).params,
        "micro_batch": micro,
        "overhead": overhead,
        "overhead_source": source,
        "rows": rows,
    }


def error(pair) -> float:
    predicted, measured = pair
    return (predicted - measured) / measured if measured else float("inf")


def markdown(res: dict) -> List[str]:
    s = res["shape"]
    lines = [
        f"GPT {s['layers']} layers, hidden {s['hidden']}, vocab {s['vocab']}, seq {s['seq']}, "
        f"micro batch {res['micro_batch']}: {res['params'] / 1e6:.1f} M params; process "
        f"overhead {res['overhead'] / GIB:.2f} GiB ({res['overhead_source']})",
        "",
        "| option | peak RSS predicted | measured | error | NVMe bytes/step predicted / "
        "measured (error) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in res["rows"]:
        traffic = "; ".join(
            f"{tier} {p / 2**20:.1f} / {m / 2**20:.1f} MiB ({100 * error((p, m)):+.1f}%)"
            for tier, (p, m) in r["traffic"].items()
        )
        pred, meas = r["rss"]
        lines.append(
            f"| {r['option']} | {pred / GIB:.2f} GiB | {meas / GIB:.2f} GiB | "
            f"{100 * error(r['rss']):+.1f}% | {traffic or '-'} |"
        )
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zerostream.bench.validate", description=__doc__)
    for k, v in (("layers", 4), ("hidden", 1024), ("heads", 16), ("vocab", 8192), ("seq", 128)):
        p.add_argument(f"--{k}", type=int, default=v, help=f"GPT {k} (default {v})")
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--options", default=",".join(DEFAULT_OPTIONS), help="STAGE/OPT/PARAMS,...")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--overhead-gib", type=float, help="skip measuring the process overhead")
    p.add_argument("--nvme-path", help="swap directory (default: a temporary one)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        options = [parse_option(o) for o in args.options.split(",") if o.strip()]
    except ValueError as exc:
        p.error(str(exc))
    shape = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "vocab", "seq")}
    overhead = int(args.overhead_gib * GIB) if args.overhead_gib else None
    res = compare(
        shape, args.micro_batch, options, overhead, args.steps, args.warmup, args.nvme_path
    )
    print(json.dumps(res, indent=2) if args.json else "\n".join(markdown(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

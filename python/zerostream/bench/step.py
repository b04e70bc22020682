"""`zerostream bench step`: training-step time of a GPT under a ds_config, against peers
measured in the same run, each in its own process (bench/step_worker.py):

  zerostream   the config as given
  no-offload   the same config without offload_optimizer/offload_param (what offload costs)
  torch        plain PyTorch, fused AdamW, the model in the run's dtype
  deepspeed    DeepSpeed with the same config, where `import deepspeed` works
  serial-step  with zerostream.overlap_step "next_forward": the same config with the serial
               step (what overlapping the update with the next forward buys)

Prints the resolved config once, then per peer the median step time, tokens/s, the phase
split (zerostream's telemetry), bytes moved per link per step and memory peaks, then the
ratios. Runs on CPU (small sizes) and on a GPU with the same command.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, Optional

from ..launcher.ports import free_port as _free_port
from ..telemetry import StepTelemetry
from . import remember, remove_deepspeed_shm
from .gpt import SIZES, GPTShape
from .step_worker import MARK

PEERS = ("zerostream", "no-offload", "torch", "deepspeed", "serial-step")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", choices=sorted(SIZES), default="tiny", help="GPT size (default tiny)")
    for name in ("layers", "hidden", "heads", "vocab", "seq"):
        p.add_argument(f"--{name}", type=int, help=f"override the size's {name}")
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per step (default 4)")
    p.add_argument("--config", help="a ds_config file (its batch keys are set from the flags)")
    p.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=2, help="without --config")
    p.add_argument("--offload-optimizer", choices=("none", "cpu", "nvme"), default="none")
    p.add_argument(
        "--offload-param", choices=("none", "cpu", "nvme"), default="none", help="stage 3 only"
    )
    p.add_argument("--nvme-path", help="for nvme offload (default: a temporary directory)")
    p.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="auto: bf16 on a GPU, fp32 on CPU",
    )
    p.add_argument(
        "--optimizer-max-on-device",
        help='zerostream.optimizer_max_on_device: elements, or "auto" (the offloaded '
        "optimizer's share stepped on the device)",
    )
    p.add_argument(
        "--overlap-step",
        nargs="?",
        const="next_forward",
        choices=["next_forward", "backward"],
        help='zerostream.overlap_step: "next_forward" (the default when given bare) or '
        '"backward" (stage 3, or 2 with "backward"; --offload-optimizer cpu)',
    )
    p.add_argument("--steps", type=int, default=5, help="measured steps (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="steps before measuring (default 2)")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma list of {', '.join(PEERS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600, help="seconds per peer")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _shape(args) -> GPTShape:
    base = SIZES[args.size]
    fields = {
        k: getattr(args, k) or getattr(base, k)
        for k in ("layers", "hidden", "heads", "vocab", "seq")
    }
    return GPTShape(**fields)


def _precision(args) -> str:
    if args.precision != "auto":
        return args.precision
    import torch

    return "bf16" if torch.cuda.is_available() else "fp32"


def _config(args, nvme_dir: str) -> dict:
    """The ds_config of the run: the file, or one built from the shorthand flags."""
    if args.config:
        from .. import _C
        from ..config import config_text

        text, source = config_text(args.config)
        cfg = _C.read_json_text(text, source)
    else:
        cfg = {
            "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
            "zero_optimization": {"stage": args.stage},
            "bf16": {"enabled": _precision(args) == "bf16"},
        }
        if args.offload_optimizer != "none":
            cfg["zero_optimization"]["offload_optimizer"] = {
                "device": args.offload_optimizer,
                "nvme_path": args.nvme_path or nvme_dir
                if args.offload_optimizer == "nvme"
                else None,
            }
        if args.offload_param != "none":
            if args.stage != 3:
                raise SystemExit("bench step: --offload-param needs --stage 3")
            cfg["zero_optimization"]["offload_param"] = {
                "device": args.offload_param,
                "nvme_path": (args.nvme_path or nvme_dir) if args.offload_param == "nvme" else None,
            }
    if args.overlap_step:
        cfg["zerostream"] = {**(cfg.get("zerostream") or {}), "overlap_step": args.overlap_step}
    if args.optimizer_max_on_device:
        value = args.optimizer_max_on_device
        value = value if value == "auto" else int(value)
        cfg["zerostream"] = {**(cfg.get("zerostream") or {}), "optimizer_max_on_device": value}
    for key in ("train_batch_size", "steps_per_print"):  # one rank; telemetry read directly
        cfg.pop(key, None)
    cfg["train_micro_batch_size_per_gpu"] = args.micro_batch
    cfg["gradient_accumulation_steps"] = 1
    return cfg


def _without_offload(cfg: dict) -> Optional[dict]:
    zero = dict(cfg.get("zero_optimization") or {})
    removed = [zero.pop(k, None) for k in ("offload_optimizer", "offload_param")]
    if not any(o and o.get("device", "none") != "none" for o in removed):
        return None
    return {**cfg, "zero_optimization": zero}


def _serial(cfg: dict) -> Optional[dict]:
    """The config with the serial step, where it overlaps the step with the next forward."""
    ext = dict(cfg.get("zerostream") or {})
    if ext.pop("overlap_step", "none") == "none":
        return None
    return {**cfg, "zerostream": ext}


def _run_peer(peer: str, cfg: dict, shape: GPTShape, args) -> dict:
    spec = {
        "peer": peer,
        "config": cfg,
        "shape": shape.__dict__,
        "micro_batch": args.micro_batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "seed": args.seed,
        "port": _free_port(),
    }
    cmd = [sys.executable, "-m", "zerostream.bench.step_worker", json.dumps(spec)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"peer": peer, "error": f"timed out after {args.timeout:.0f} s"}
    finally:
        remove_deepspeed_shm("127.0.0.1", spec["port"])
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
    return {"peer": peer, "error": f"exit code {done.returncode}:\n{tail}"}


def _summarise(res: dict, tokens_per_step: int) -> dict:
    if "step_seconds" not in res:
        return res
    failed = res.get("host_registration", {}).get("register_failed", 0)
    if failed and res.get("device", "").startswith("cuda"):
        # A refused cudaHostRegister leaves that memory pageable: every copy from it is
        # synchronous, so the step measured is not the product's.
        res["error"] = (
            f"{failed} host arena range(s) could not be registered with the GPU "
            f"(cudaHostRegister refused; see the warning above): their copies ran synchronously"
        )
    median = statistics.median(res["step_seconds"])
    res["median_step_seconds"] = median
    res["tokens_per_second"] = tokens_per_step / median
    seconds = res.get("tier_seconds", {})
    res["links"] = {
        tier: {
            "bytes_per_step": b,
            "gb_per_s": b / seconds[tier] / 1e9 if seconds.get(tier) else None,
        }
        for tier, b in res.get("bytes_per_step", {}).items()
    }
    return res


def measure(args) -> dict:
    for flag in ("steps", "warmup", "micro_batch"):
        if getattr(args, flag) < (1 if flag != "warmup" else 0):
            raise ValueError(f"--{flag.replace('_', '-')}: expected a positive count")
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        raise ValueError(f"--peers: unknown {unknown}; choose from {', '.join(PEERS)}")
    shape = _shape(args)
    with tempfile.TemporaryDirectory(prefix="zs-bench-step-") as nvme_dir:
        cfg = _config(args, nvme_dir)
        results: Dict[str, dict] = {}
        for peer in peers:
            variants = {"no-offload": _without_offload, "serial-step": _serial}
            peer_cfg = variants[peer](cfg) if peer in variants else cfg
            if peer_cfg is None:
                why = "offloads nothing" if peer == "no-offload" else "has no overlap_step"
                results[peer] = {"peer": peer, "skipped": f"the config {why}"}
                continue
            results[peer] = _summarise(
                _run_peer(peer, peer_cfg, shape, args), args.micro_batch * shape.seq
            )
    return {
        "shape": shape.__dict__,
        "params": shape.params,
        "config": cfg,
        "micro_batch": args.micro_batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "peers": results,
        "ratios": _ratios(
            results,
            cfg.get("zero_optimization", {}).get("offload_param", {}).get("device", "none")
            != "none",
            _serial(cfg) is not None,
        ),
    }


def _ratios(
    results: Dict[str, dict], params_offloaded: bool = False, overlapped: bool = False
) -> Dict[str, Optional[float]]:
    """Peer's median step time / zerostream's: above 1, zerostream is faster. With the step
    overlapped, the optimizer's own bounds do not apply (its update runs beside the next
    forward, not inside step())."""
    ours = results.get("zerostream", {}).get("median_step_seconds")
    out = {}
    for name, res in results.items():
        if name != "zerostream" and ours and res.get("median_step_seconds"):
            out[f"{name}_over_zerostream"] = res["median_step_seconds"] / ours
    noff = results.get("no-offload", {}).get("median_step_seconds")
    step = results.get("zerostream", {}).get("phase_seconds", {}).get("step")
    if overlapped:
        return out
    if ours and noff and step is not None:
        # With the copies and the CPU step overlapped with compute, an offload step cannot
        # beat the slower of the compute (the no-offload step) and the optimizer step.
        out["bound_seconds"] = max(noff, step)
        out["zerostream_over_bound"] = ours / out["bound_seconds"]
    out.update(_step_pipeline(results.get("zerostream", {}), params_offloaded))
    return out


def _step_pipeline(res: dict, params_offloaded: bool) -> Dict[str, float]:
    """The optimizer step against its own bound: pipelined piece by piece, the CPU update and
    the uploads of its results overlap (Note [Partition sinks]), so the step cannot beat the
    slower of the two (`cpu_update`; the upload lane's busy "h2d" seconds); its ratio to
    that bound says how much else (the norm, waits, hand-offs, the fence) the step leaves
    exposed. The gradients' downloads ran in backward, not here. Empty where the CPU update
    was not measured (no CPU optimizer), and with offload_param, whose gathers' uploads share
    the lane's seconds."""
    phases, links = res.get("phase_seconds", {}), res.get("tier_seconds", {})
    update, step = phases.get("cpu_update"), phases.get("step")
    if not update or not step or params_offloaded:
        return {}
    bound = max(update, links.get("h2d", 0.0))
    return {"step_bound_seconds": bound, "step_over_its_bound": step / bound}


def _gib(n) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def _print_table(res: dict) -> None:
    s = res["shape"]
    print(
        f"GPT {s['layers']} layers, hidden {s['hidden']}, {s['heads']} heads, vocab {s['vocab']}, "
        f"seq {s['seq']}: {res['params'] / 1e6:.1f} M params; micro batch {res['micro_batch']}; "
        f"{res['steps']} steps after {res['warmup']} warm-up"
    )
    print("config: " + json.dumps(res["config"], sort_keys=True))
    print(
        f"{'peer':12s} {'s/step':>9s} {'tokens/s':>10s} {'RSS GiB':>8s} {'dev GiB':>8s} "
        f"{'loss 1st':>9s}  phases (ms/step) | bytes per step"
    )
    for name, r in res["peers"].items():
        if "median_step_seconds" not in r:
            print(f"{name:12s} {r.get('skipped') or r.get('error')}")
            continue
        issued = r.get("issue_timed", False)  # host time of issuing GPU work: marked *
        phases = " ".join(
            f"{k} {1000 * v:.1f}{'*' if issued else ''}"
            for k, v in sorted(r["phase_seconds"].items())
        )

        def link(tier: str, v: dict, issued: bool = issued) -> str:
            text = f"{tier} {v['bytes_per_step'] / 2**20:.1f} MiB"
            if v["gb_per_s"]:
                star = "*" if issued and tier in StepTelemetry.COLLECTIVES else ""
                text += f" ({v['gb_per_s']:.2f} GB/s{star})"
            return text

        links = " ".join(link(t, v) for t, v in sorted(r["links"].items()))
        print(
            f"{name:12s} {r['median_step_seconds']:9.4f} {r['tokens_per_second']:10.0f} "
            f"{_gib(r['peak_rss_bytes']):>8s} {_gib(r['peak_device_bytes']):>8s} "
            f"{r['losses'][0]:9.4f}  {phases or '-'} | {links or '-'}"
        )
        if r.get("error"):
            print(f"{name:12s} FAILED: {r['error']}")
    for key, value in res["ratios"].items():
        print(f"{key}: {value:.3f}")
    if any(r.get("issue_timed") for r in res["peers"].values()):
        print("* host issue time on the GPU (the GPU may still be running), not the work's time")


def run(args) -> int:
    res = measure(args)
    if "error" not in res["peers"].get("zerostream", {}):
        remember("step", res)  # this machine's swap-link rates for `zerostream estimate`
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        _print_table(res)
    failed = [n for n, r in res["peers"].items() if "error" in r]
    if failed:
        print(f"peers failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if "error" in res["peers"].get("zerostream", {}) else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="zerostream bench step", description=__doc__.split("\n")[0]
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

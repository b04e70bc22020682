"""The `zerostream` command: run, report, config check, estimate, bench, zero-to-fp32."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Optional

from . import __version__

_BENCHES = ("io", "optim", "step", "capacity", "checkpoint")


def _config_check(args) -> int:
    from .config_check import check

    result = check(
        args.file,
        world_size=args.world_size,
        micro_batch_size=args.micro_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        hidden_size=args.hidden_size,
        model_dtype=args.model_dtype,
    )
    if args.json:
        out = {k: result[k] for k in ("ok", "errors", "warnings", "notes", "resolved")}
        print(json.dumps(out, indent=2))
        return 0 if result["ok"] else 1
    if not result["ok"]:
        print(f"{args.file}: invalid", file=sys.stderr)
        for e in result["errors"]:
            print(f"  error: {e}", file=sys.stderr)
        for w in result["warnings"]:
            print(f"  warning: {w}", file=sys.stderr)
        return 1
    print(f"{args.file}: ok")
    # Unset optional keys (null defaults) are left out of the text view; --json has them.
    resolved = {
        k: v
        for k, v in result["resolved"].items()
        if not (v["value"] is None and v["source"] == "default")
    }
    width = max(len(k) for k in resolved) if resolved else 0
    for path, entry in resolved.items():
        print(f"  {path:<{width}}  {json.dumps(entry['value']):<24} [{entry['source']}]")
    for n in result["notes"]:
        print(f"  note: {n}")
    for w in result["warnings"]:
        print(f"  warning: {w}")
    return 0


def _bench(args) -> int:
    try:
        module = importlib.import_module(f"zerostream.bench.{args.bench_name}")
    except ModuleNotFoundError:
        print(f"zerostream bench {args.bench_name}: not available in this build", file=sys.stderr)
        return 2
    return module.run(args)


COMMANDS = ("run", "report", "config", "zero-to-fp32", "bench", "estimate")


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The whole CLI, or with `only` just that command's parser: the launcher, the
    checkpoint tools and the benchmarks import torch (seconds), which `config check` and
    `estimate`, reading JSON, must not wait for."""
    parser = argparse.ArgumentParser(prog="zerostream", description=__doc__)
    parser.add_argument("--version", action="version", version=f"zerostream {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def wanted(name: str) -> bool:
        return only is None or only == name

    if wanted("run"):
        from . import launcher

        launcher.add_parser(sub)  # `run`; flags after the script go to the script

    if wanted("report"):
        report = sub.add_parser("report", help="versions, SIMD, io_uring, O_DIRECT, CUDA, backends")
        report.add_argument("--path", help="directory whose O_DIRECT support to probe")
        report.add_argument("--json", action="store_true", help="print one JSON object")
        report.set_defaults(func=lambda a: importlib.import_module("zerostream.report").run(a))

    if wanted("config"):
        _add_config(sub)
    if wanted("zero-to-fp32"):
        z2f = sub.add_parser(
            "zero-to-fp32",
            help="whole fp32 weights from a ZeRO checkpoint (pytorch_model.bin or safetensors)",
        )
        from .checkpoint import zero_to_fp32

        zero_to_fp32.add_arguments(z2f)
        z2f.set_defaults(func=zero_to_fp32.run)

    if wanted("bench"):
        bench = sub.add_parser("bench", help="benchmarks with ratios against a peer")
        bench_sub = bench.add_subparsers(dest="bench_name", required=True)
        for name in _BENCHES:
            p = bench_sub.add_parser(name, help=f"{name} benchmark")
            try:
                importlib.import_module(f"zerostream.bench.{name}").add_arguments(p)
            except ModuleNotFoundError:
                pass
            p.set_defaults(func=_bench)

    if wanted("estimate"):
        from . import estimate

        estimate.add_parser(sub)
    return parser


def _add_config(sub) -> None:
    cfg = sub.add_parser("config", help="ds_config tools")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    check = cfg_sub.add_parser("check", help="validate a ds_config and print it resolved")
    check.add_argument("file")
    check.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="processes in the run (default: data-parallel size 1)",
    )
    check.add_argument(
        "--micro-batch-size",
        type=int,
        default=None,
        help='resolves train_micro_batch_size_per_gpu "auto"',
    )
    check.add_argument(
        "--gradient-accumulation-steps",
        type=int,
        default=None,
        help='resolves gradient_accumulation_steps "auto"',
    )
    check.add_argument(
        "--hidden-size",
        type=int,
        default=None,
        help='resolves bucket sizes and thresholds set to "auto"',
    )
    check.add_argument(
        "--model-dtype",
        choices=("fp32", "fp16", "bf16"),
        default=None,
        help='resolves fp16/bf16 enabled "auto"',
    )
    check.add_argument(
        "--json",
        action="store_true",
        help='print {"ok", "errors", "warnings", "notes", "resolved"}',
    )
    check.set_defaults(func=_config_check)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The command is the first word; options before it are the top level's (--version).
    first = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(only=first if first in COMMANDS else None).parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

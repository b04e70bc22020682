"""`zerostream bench capacity`: trains a GPT whose model states do not fit in host memory, with
ZeRO-3 parameters and optimizer state on NVMe, and reports what that costs.

    zerostream bench capacity --nvme-path /mnt/nvme/zs --layers 36 --hidden 2560 --steps 3

The model is built under zero.Init (each module's parameters go to disk as the module is
constructed, so the whole model never exists in memory), then trained on synthetic tokens
on one rank. Printed: the model states (16 bytes per parameter: the fp32 parameter shard,
Adam's fp32 master, exp_avg, exp_avg_sq) against this machine's RAM, the host-memory budget
the configuration implies and the peak RSS measured against it, the bytes each tier moved
per step and the time split (forward, backward, optimizer step, waits). States larger than
RAM and an RSS within the budget are the point of the run: the verdict line says whether
both held. Where "auto" placed the optimizer's host tier, the budget is the ceiling "auto"
allowed itself (the RSS it placed at, the step's measured excess and its whole budget: only
its reserve left free), and each placed step's own peak RSS is reported against the peak it
predicted (Note [Predicting the placed step]).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import torch

from .. import sizing
from ..offload.placement import window
from .corpus import read_corpus, text_batches, vocabulary
from .gpt import GPT, GPTShape, batches
from .memory import memory_status, peak_rss_bytes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--hidden", type=int, default=2560)
    p.add_argument("--heads", type=int, default=20)
    p.add_argument("--vocab", type=int, default=8192, help="synthetic tokens' vocabulary")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument(
        "--corpus-mb",
        type=float,
        default=0.0,
        help="train on the demo's text (bench/corpus.py: this many MiB of the standard "
        "library's source, byte tokens, vocabulary 256) instead of synthetic tokens",
    )
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW's learning rate")
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=0,
        help="DeepSpeed's WarmupLR, linear from 0 to --lr over this many steps (0: none)",
    )
    p.add_argument("--nvme-path", help="swap directory (default: a temporary one, removed)")
    p.add_argument("--sub-group-size", type=float, default=5e7, help="optimizer sub-group")
    p.add_argument("--buffer-size", type=float, default=5e7, help="offload_param.buffer_size")
    p.add_argument("--max-live", type=float, default=1e8, help="stage3_max_live_parameters")
    p.add_argument("--bf16", action="store_true", help="bf16 model (fp32 optimizer state)")
    p.add_argument(
        "--bf16-masters",
        action="store_true",
        help="bf16 model with bf16.bf16_master_weights_and_grads (bf16 masters, fp32 moments: "
        "10 bytes of optimizer state an element, not 12)",
    )
    p.add_argument(
        "--bf16-states",
        action="store_true",
        help="bf16 model with bf16.bf16_master_weights_and_grads and bf16_optimizer_states "
        "(bf16 masters and moments: 6 bytes of optimizer state an element, not 12)",
    )
    p.add_argument(
        "--wide-matmul",
        action="store_true",
        help="a bf16 model's matmuls in fp32 (bench/gpt.py WideLinear): on a CPU without bf16 "
        "GEMM hardware torch's bf16 GEMM is a scalar fallback that makes the step compute-bound",
    )
    p.add_argument(
        "--optimizer-max-in-cpu",
        default=None,
        help="zerostream.optimizer_max_in_cpu: elements of optimizer state kept in host memory, "
        'or "auto" (default 0: all on NVMe)',
    )
    p.add_argument(
        "--param-max-in-cpu",
        default=None,
        help='offload_param.max_in_cpu: elements of param shards kept in host memory, or "auto" '
        "(the most-read after the first step; default 0: all on NVMe)",
    )
    p.add_argument(
        "--compare-tiers",
        action="store_true",
        help="run all on NVMe and tiered (--optimizer-max-in-cpu, or auto) in two processes, "
        "measure the disk with fio, print both against the disk-bound floor",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --compare-tiers: run the pair this many times, alternating which goes "
        "first (a shared VM's disk drifts between runs by more than small gains)",
    )
    p.add_argument(
        "--host-malloc",
        choices=("retain", "system"),
        default="system",
        help='zerostream.host_malloc: "retain" keeps freed host memory for the next step (no '
        "fresh pages to fault in: Note [Fresh pages cost more than the math]; with "
        '"auto" tiers too: trimmed at each step end until they are placed); "system" is '
        "glibc's policy, the engine's default",
    )
    p.add_argument(
        "--overlap-step",
        choices=("none", "next_forward"),
        default="none",
        help='zerostream.overlap_step: "next_forward" runs the NVMe optimizer step behind the '
        "next forward (zero/overlap.py); a step is then timed from its forward to its step()'s "
        "return, so it holds the rest of the previous step's update",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _rss_gib() -> float:
    """Peak RSS of this process so far."""
    return peak_rss_bytes() / 2**30  # VmHWM: Note [A child's peak RSS] in bench/memory.py


def _rss_now_gib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**30


def _max_in_cpu(text):
    """A --*-max-in-cpu flag's value (None: not given, 0 for one run; "auto" when tiered)."""
    if text is None:
        return 0
    return text if text == "auto" else int(float(text))


def _bf16_masters(args) -> bool:
    """bf16.bf16_master_weights_and_grads: --bf16-masters, or --bf16-states (which needs it)."""
    return bool(args.bf16_masters or args.bf16_states)


def _state_bytes(args) -> int:
    """Optimizer-state bytes an element, master and two moments: 12, 10 or 6."""
    return sizing.optimizer_state_bytes(_bf16_masters(args), args.bf16_states)


def _bf16_model(args) -> bool:
    """A bf16 model: --bf16, or bf16 masters (which need one)."""
    return bool(args.bf16 or _bf16_masters(args))


def _config(args, nvme: str) -> dict:
    bf16 = {"enabled": _bf16_model(args)}
    if _bf16_masters(args):
        bf16.update(bf16_master_weights_and_grads=True, bf16_optimizer_states=args.bf16_states)
    return {
        "bf16": bf16,
        "zerostream": {
            "optimizer_max_in_cpu": _max_in_cpu(args.optimizer_max_in_cpu),
            "host_malloc": args.host_malloc,
            "overlap_step": args.overlap_step,
        },
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 0,
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "weight_decay": 0.01}},
        **(
            {
                "scheduler": {
                    "type": "WarmupLR",
                    "params": {
                        "warmup_min_lr": 0.0,
                        "warmup_max_lr": args.lr,
                        "warmup_num_steps": args.warmup_steps,
                        "warmup_type": "linear",
                    },
                }
            }
            if args.warmup_steps > 0
            else {}
        ),
        "zero_optimization": {
            "stage": 3,
            "sub_group_size": int(args.sub_group_size),
            "stage3_max_live_parameters": int(args.max_live),
            "stage3_prefetch_bucket_size": int(args.max_live) // 2,
            "stage3_param_persistence_threshold": 10**5,
            "reduce_bucket_size": int(args.max_live) // 2,
            "offload_param": {
                "device": "nvme",
                "nvme_path": nvme,
                "max_in_cpu": _max_in_cpu(args.param_max_in_cpu),
                "buffer_size": int(args.buffer_size),
                "buffer_count": 4,
                "pin_memory": False,
            },
            "offload_optimizer": {
                "device": "nvme",
                "nvme_path": nvme,
                "pipeline_read": True,
                "pipeline_write": True,
                "buffer_count": 6,
                "pin_memory": False,
            },
        },
    }


def host_budget_bytes(
    numel: int, args, host_state_elements: int = 0, kept_shard_bytes: int = 0, largest: int = 0
) -> int:
    """Host memory the configuration implies on one rank, each allocation sized as the
    runtime sizes it (sizing.py): the gradient partition (16-bit with a bf16 model, Note
    [Gradients to an offloaded partition]), the optimizer's staging (2 sets x 3 sub-groups of
    the widest state kind), the optimizer state kept in host memory (12 bytes an element, 10
    with --bf16-masters, 6 with --bf16-states), the parameter shards kept in host memory, the
    param staging arena (4 buffers, at least twice the `largest` parameter's shard, at most
    every shard), the gathered parameters (max_live, twice for prefetch), and 3 GiB for
    torch, Python and activations."""
    sub = min(int(args.sub_group_size), numel)
    width = 2 if _bf16_model(args) else 4
    grads = sizing.offloaded_grad_bytes("bf16" if _bf16_model(args) else "fp32", 1)
    widest = sizing.widest_state_bytes(_bf16_masters(args), args.bf16_states)
    buffers = _config(args, "")["zero_optimization"]
    return (
        grads * numel
        + sizing.optimizer_staging_bytes(buffers["offload_optimizer"]["buffer_count"], sub, widest)
        + _state_bytes(args) * host_state_elements
        + kept_shard_bytes
        + sizing.param_staging_bytes(
            width * largest,
            buffers["offload_param"]["buffer_count"],
            int(args.buffer_size),
            width * numel,
        )
        + 2 * width * int(args.max_live)
        + (3 << 30)
    )


def _data(args, shape: GPTShape, device):
    if args.corpus_mb > 0:
        train, _ = read_corpus(args.corpus_mb)
        return text_batches(train, args.micro_batch, shape.seq, device)
    return batches(shape, args.micro_batch, device)


def measure(args) -> dict:
    import psutil

    import zerostream
    from zerostream import comm, host_malloc

    shape = GPTShape(
        args.layers, args.hidden, args.heads, vocabulary(args.corpus_mb, args.vocab), args.seq
    )
    owned = args.nvme_path is None
    nvme = args.nvme_path or tempfile.mkdtemp(prefix="zs-capacity-")
    ram = psutil.virtual_memory().total
    cfg = _config(args, nvme)
    comm.init_distributed(verbose=False)
    try:
        start = time.perf_counter()
        torch.manual_seed(0)
        dtype = torch.bfloat16 if _bf16_model(args) else torch.float32
        with zerostream.zero.Init(config_dict_or_path=cfg, dtype=dtype):
            model = GPT(shape, wide_matmul=args.wide_matmul)
        built = time.perf_counter() - start
        rss_built = (_rss_gib(), _rss_now_gib())
        engine, optimizer, _, _ = zerostream.initialize(model=model, config=cfg)
        ready = time.perf_counter() - start - built
        rss_ready = _rss_now_gib()
        data = _data(args, shape, engine.device)
        tel = engine.telemetry
        step_times, losses, settled, step_phases = [], [], [], []
        step_rss, step_peaks = [], []
        for _ in range(args.steps):
            tel.seconds.clear()
            tel.bytes.clear()
            tel.tier_seconds.clear()
            t0 = time.perf_counter()
            x, y = next(data)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            step_times.append(time.perf_counter() - t0)
            losses.append(float(loss.detach()))
            settled.append(_tiers_settled(engine))
            step_phases.append(_phases(tel))
            step_rss.append(round(memory_status().get("VmRSS", 0) / 2**30, 3))
            step_peaks.append(_placed_step_peak(settled))
        phases = step_phases[-1] if step_phases else {}
        moved = {
            tier: {
                "bytes": int(b),
                "gib": round(b / 2**30, 3),
                "gb_per_s": round(b / tel.tier_seconds[tier] / 1e9, 3)
                if tel.tier_seconds.get(tier)
                else None,
            }
            for tier, b in tel.bytes.items()
        }
        numel = shape.params
        width = 2 if _bf16_model(args) else 4
        states = (width + _state_bytes(args)) * numel
        tiers = engine.optimizer.swapper.tiers
        peak = _rss_gib()
        summary = optimizer.state_summary()
        swap = summary["params"].get("swap") or {}
        # Shards kept by an element count or brought back by "auto" (arena pages).
        kept = max(swap.get("kept_bytes", 0), width * swap.get("in_cpu_numel", 0))
        largest = shape.vocab * shape.hidden  # the embedding (tied head)
        budget = host_budget_bytes(numel, args, tiers.host_elements, kept, largest)
        prediction = engine.optimizer.swapper.prediction or {}
        placed_peaks = [p for p in step_peaks if p is not None]
        placed_peak = max(placed_peaks) if placed_peaks else None
        predicted = prediction.get("predicted_peak_rss_bytes")
        ceiling = prediction.get("host_ceiling_bytes")
        return {
            "shape": shape.__dict__,
            "data": f"corpus ({args.corpus_mb} MiB)" if args.corpus_mb > 0 else "synthetic",
            "lr": args.lr,
            "warmup_steps": args.warmup_steps,
            "host_malloc": args.host_malloc,
            "host_malloc_trims": host_malloc.trims(),  # the valve (retain), times it opened
            "params": numel,
            "model_states_gib": round(states / 2**30, 2),
            "ram_gib": round(ram / 2**30, 2),
            "states_over_ram": round(states / ram, 2),
            # DeepSpeed's count for mixed precision (16 B a parameter with fp32 Adam): the
            # states and the gradient partition (16-bit with a bf16 model).
            "states_and_grads_gib": round((states + width * numel) / 2**30, 2),
            "states_and_grads_over_ram": round((states + width * numel) / ram, 2),
            "host_budget_gib": round(budget / 2**30, 2),
            "peak_rss_gib": round(peak, 2),
            # VmRSS at each step's end, and each step's own peak once every tier is placed
            # (None before): the placed steps' peak against what "auto" predicted for them.
            "step_rss_gib": step_rss,
            "step_peak_rss_gib": step_peaks,
            "placed_peak_rss_gib": placed_peak,
            "predicted_peak_rss_gib": _gib(predicted),
            "placed_peak_over_predicted": round(placed_peak * 2**30 / predicted, 3)
            if placed_peak is not None and predicted
            else None,
            "auto_host_ceiling_gib": _gib(ceiling),
            "rss_after_build_gib": {
                "peak": round(rss_built[0], 2),
                "now": round(rss_built[1], 2),
            },
            "rss_after_initialize_gib": round(rss_ready, 2),
            "rss_after_steps_gib": round(_rss_now_gib(), 2),
            "build_seconds": round(built, 1),
            "initialize_seconds": round(ready, 1),
            "step_seconds": [round(t, 2) for t in step_times],
            "tiers_settled_after_step": settled,
            "last_step_phases_seconds": phases,
            # Each step's phases and disk bytes: what changes between the steps of a run.
            "step_phases": step_phases,
            "last_step_moved": moved,
            "losses": losses,
            # On real text (--corpus-mb) the loss of the last steps is below the first's.
            "losses_fell": len(losses) > 1 and max(losses[len(losses) // 2 :]) < losses[0],
            "swap_directory_gib": round(_du(nvme) / 2**30, 2),
            "param_in_cpu_numel": (summary["params"].get("swap") or {}).get("in_cpu_numel", 0),
            "optimizer_tiers": {
                "host_elements": tiers.host_elements,
                "nvme_elements": tiers.nvme_elements,
                "budget_elements": tiers.budget_elements,
                "source": tiers.source,
                # "auto": the step time it predicted when it placed the tier, and why.
                "prediction": engine.optimizer.swapper.prediction,
                "order_inputs": engine.optimizer.placement.order_inputs,
            },
            "param_kept_bytes": kept,
            # The stage-3 plan's peak of gathered elements (prefetch and reuse distance).
            "planned_peak_live": summary["trace"]["planned_peak_live"],
            "param_swap": summary["params"].get("swap"),
            "verdict": {
                "states_larger_than_ram": states > ram,
                # Where "auto" placed the optimizer tier, the budget is the ceiling it
                # allowed itself (only its reserve left free): the formula cannot know what
                # "auto" takes. The formula otherwise.
                "rss_within_budget": peak * 2**30 <= (ceiling or budget),
            },
        }
    finally:
        if owned:
            shutil.rmtree(nvme, ignore_errors=True)


def _gib(n) -> "float | None":
    return None if n is None else round(n / 2**30, 2)


def _placed_step_peak(settled: list) -> "float | None":
    """The peak RSS (GiB) of the step just ended if every tier was placed before it began;
    None otherwise. Restarts the peak at each step's end from the one that placed the last
    tier on (no "auto" tier restarts it then: Note [A step's excess])."""
    if not settled[-1]:
        return None
    peak = window.restart_window_peak()
    if len(settled) < 2 or not settled[-2] or peak is None:
        return None
    return round(peak / 2**30, 3)


def _phases(tel) -> dict:
    """One step's seconds by phase and the GB it read and wrote on disk."""
    out = {k: round(v, 3) for k, v in tel.seconds.items()}
    for tier, b in tel.bytes.items():
        if tier.endswith(("nvme_read", "nvme_write")):
            out[f"{tier}_gb"] = round(b / 1e9, 3)
    return out


def _tiers_settled(engine) -> bool:
    """Whether every "auto" tier has been placed (Note ["auto" is sized from a measured
    step]): the steps after the one that placed them are the tiered run's steady state."""
    return not engine.optimizer.placement.window.waiting


def _du(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def run(args) -> int:
    if args.compare_tiers:
        from .tier_compare import compare, print_compare

        res = compare(args)
        if args.json:
            print(json.dumps(res))  # the verdicts are in it, as with one run
            return 0
        print_compare(res)
        ok = all(all(r["verdict"].values()) for r in res["runs"].values())
        return 0 if ok and res["same_losses"] else 1
    res = measure(args)
    if args.json:
        print(json.dumps(res))
        return 0
    s = res["shape"]
    print(
        f"GPT {s['layers']} layers, hidden {s['hidden']}: {res['params'] / 1e9:.2f} B params; "
        f"model states {res['model_states_gib']} GiB = {res['states_over_ram']}x this "
        f"machine's RAM ({res['ram_gib']} GiB)"
    )
    print(
        f"built under zero.Init in {res['build_seconds']} s (RSS GiB {res['rss_after_build_gib']}"
        f"), initialize {res['initialize_seconds']} s (RSS {res['rss_after_initialize_gib']} "
        f"GiB), "
        f"swap files {res['swap_directory_gib']} GiB"
    )
    print(
        f"with the gradient partition {res['states_and_grads_gib']} GiB = "
        f"{res['states_and_grads_over_ram']}x RAM; data: {res['data']}"
    )
    print(f"step seconds: {res['step_seconds']}  losses: {[round(x, 4) for x in res['losses']]}")
    print(f"last step phases (s): {res['last_step_phases_seconds']}")
    print(f"last step moved: {res['last_step_moved']}")
    if res["predicted_peak_rss_gib"] is not None:
        print(
            f'placed steps\' peak RSS {res["placed_peak_rss_gib"]} GiB; "auto" predicted '
            f"{res['predicted_peak_rss_gib']} GiB (x{res['placed_peak_over_predicted']}) and "
            f"allowed itself {res['auto_host_ceiling_gib']} GiB"
        )
    print(
        f"peak RSS {res['peak_rss_gib']} GiB against a host budget of "
        f"{res['host_budget_gib']} GiB: verdict {res['verdict']}"
    )
    return 0 if all(res["verdict"].values()) else 1

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
both held.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import torch

from .gpt import GPT, GPTShape, batches
from .memory import peak_rss_bytes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--hidden", type=int, default=2560)
    p.add_argument("--heads", type=int, default=20)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--nvme-path", help="swap directory (default: a temporary one, removed)")
    p.add_argument("--sub-group-size", type=float, default=5e7, help="optimizer sub-group")
    p.add_argument("--buffer-size", type=float, default=5e7, help="offload_param.buffer_size")
    p.add_argument("--max-live", type=float, default=1e8, help="stage3_max_live_parameters")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _rss_gib() -> float:
    """Peak RSS of this process so far."""
    return peak_rss_bytes() / 2**30  # VmHWM: Note [A child's peak RSS] in bench/memory.py


def _rss_now_gib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**30


def _config(args, nvme: str) -> dict:
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
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
                "max_in_cpu": 0,
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


def host_budget_bytes(numel: int, args) -> int:
    """Host memory the configuration implies on one rank: the fp32 gradient partition, the
    optimizer's staging (2 sets x 3 fp32 sub-groups), the param staging arena (2 x 4 buffers),
    the gathered parameters (max_live, fp32, twice for prefetch), and 3 GiB for torch,
    Python and activations."""
    sub = min(int(args.sub_group_size), numel)
    return (
        4 * numel
        + 2 * 3 * 4 * sub
        + 2 * 4 * 4 * int(args.buffer_size)
        + 2 * 4 * int(args.max_live)
        + (3 << 30)
    )


def measure(args) -> dict:
    import psutil

    import zerostream
    from zerostream import comm

    shape = GPTShape(args.layers, args.hidden, args.heads, args.vocab, args.seq)
    owned = args.nvme_path is None
    nvme = args.nvme_path or tempfile.mkdtemp(prefix="zs-capacity-")
    ram = psutil.virtual_memory().total
    cfg = _config(args, nvme)
    comm.init_distributed(verbose=False)
    try:
        start = time.perf_counter()
        torch.manual_seed(0)
        with zerostream.zero.Init(config_dict_or_path=cfg, dtype=torch.float32):
            model = GPT(shape)
        built = time.perf_counter() - start
        rss_built = (_rss_gib(), _rss_now_gib())
        engine, optimizer, _, _ = zerostream.initialize(model=model, config=cfg)
        ready = time.perf_counter() - start - built
        rss_ready = _rss_now_gib()
        data = batches(shape, args.micro_batch, engine.device)
        tel = engine.telemetry
        step_times, losses = [], []
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
        phases = {k: round(v, 3) for k, v in tel.seconds.items()}
        moved = {
            tier: {
                "gib": round(b / 2**30, 3),
                "gb_per_s": round(b / tel.tier_seconds[tier] / 1e9, 3)
                if tel.tier_seconds.get(tier)
                else None,
            }
            for tier, b in tel.bytes.items()
        }
        numel = shape.params
        states = 16 * numel
        budget = host_budget_bytes(numel, args)
        peak = _rss_gib()
        summary = optimizer.state_summary()
        return {
            "shape": shape.__dict__,
            "params": numel,
            "model_states_gib": round(states / 2**30, 2),
            "ram_gib": round(ram / 2**30, 2),
            "states_over_ram": round(states / ram, 2),
            "host_budget_gib": round(budget / 2**30, 2),
            "peak_rss_gib": round(peak, 2),
            "rss_after_build_gib": {
                "peak": round(rss_built[0], 2),
                "now": round(rss_built[1], 2),
            },
            "rss_after_initialize_gib": round(rss_ready, 2),
            "rss_after_steps_gib": round(_rss_now_gib(), 2),
            "build_seconds": round(built, 1),
            "initialize_seconds": round(ready, 1),
            "step_seconds": [round(t, 2) for t in step_times],
            "last_step_phases_seconds": phases,
            "last_step_moved": moved,
            "losses": losses,
            "swap_directory_gib": round(_du(nvme) / 2**30, 2),
            "param_swap": summary["params"].get("swap"),
            "verdict": {
                "states_larger_than_ram": states > ram,
                "rss_within_budget": peak * 2**30 <= budget,
            },
        }
    finally:
        if owned:
            shutil.rmtree(nvme, ignore_errors=True)


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
    print(f"step seconds: {res['step_seconds']}  losses: {[round(x, 4) for x in res['losses']]}")
    print(f"last step phases (s): {res['last_step_phases_seconds']}")
    print(f"last step moved: {res['last_step_moved']}")
    print(
        f"peak RSS {res['peak_rss_gib']} GiB against a host budget of "
        f"{res['host_budget_gib']} GiB: verdict {res['verdict']}"
    )
    return 0 if all(res["verdict"].values()) else 1

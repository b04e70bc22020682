"""Train a GPT through DeepSpeed's API on zerostream: the main job.

    zerostream run --nproc 2 examples/train_gpt.py \
        --deepspeed_config configs/zero3_offload_nvme.json

The text is the Python standard library's own source, read at run time (nothing is downloaded),
tokenized byte by byte; every 20th file is held out for a validation loss. Sizes go from `tiny`
(seconds on a laptop CPU) to `1.3b` and beyond (`--layers/--hidden/--heads`). The same command
runs on CPU ranks (Gloo) and on GPUs (NCCL), one process per rank.

The script is an ordinary DeepSpeed training script: `initialize`, `engine(x, y)`,
`engine.backward`, `engine.step`, `zero.Init` at stage 3, `save_checkpoint`/`load_checkpoint`.
Change `import zerostream as deepspeed` to `import deepspeed` and it runs on DeepSpeed, less the
traffic columns (DeepSpeed has no per-tier counters).

At the end rank 0 prints a summary (losses first -> last, time per phase, memory peaks, bytes
moved per tier) and writes a PNG of loss and traffic over the steps.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import time
from pathlib import Path
from typing import Dict, List

import hjson
import torch
import torch.distributed as dist

import zerostream as deepspeed
from zerostream.bench.corpus import VOCAB, read_corpus, windows
from zerostream.bench.gpt import GPT, GPTShape

SIZES = {  # layers, hidden, heads, seq
    "tiny": (2, 64, 4, 64),
    "small": (4, 256, 4, 128),
    "gpt2": (12, 768, 12, 512),
    "350m": (24, 1024, 16, 1024),
    "1.3b": (24, 2048, 16, 1024),
    "2.7b": (32, 2560, 32, 1024),
}
TIERS = ("comm", "nvme_read", "nvme_write", "param_nvme_read", "param_nvme_write")


# --- data ---------------------------------------------------------------------------------------
def micro_batch(text, step, micro, rank, args, device):
    """The rank's `micro`-th micro-batch of global step `step`: a pure function of the step, so
    a resumed run draws exactly what the uninterrupted one would have."""
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 7919 + micro * 131 + rank)
    w = windows(text, args.micro_batch, args.seq, gen).to(device)
    return w[:, :-1], w[:, 1:]


@torch.no_grad()
def validation_loss(engine, valid, args, device) -> float:
    """Mean loss over fixed held-out windows; every rank runs the same batches (stage 3's
    forward needs every rank), so the value is the same everywhere."""
    gen = torch.Generator().manual_seed(12345)
    engine.eval()
    losses = []
    for _ in range(args.eval_batches):
        w = windows(valid, args.micro_batch, args.seq, gen).to(device)
        losses.append(float(engine(w[:, :-1], w[:, 1:]).float()))
    engine.train()
    return sum(losses) / len(losses)


# --- set-up -------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--layers", type=int, help="overrides --size")
    p.add_argument("--hidden", type=int, help="overrides --size")
    p.add_argument("--heads", type=int, help="overrides --size")
    p.add_argument("--seq", type=int, help="overrides --size")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps to run (this launch)")
    p.add_argument("--micro-batch", type=int, help="default: the config's")
    p.add_argument("--grad-accum", type=int, help="default: the config's")
    p.add_argument("--lr", type=float, help="default: the config's")
    p.add_argument("--eval-every", type=int, default=20, help="validation loss every N steps")
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--corpus-mb", type=float, default=8.0, help="stdlib bytes to read")
    p.add_argument("--nvme-path", help="replaces every nvme_path in the config")
    p.add_argument("--save-dir", help="save a checkpoint here at the end")
    p.add_argument(
        "--save-at",
        type=int,
        help="with --save-dir: save after this many steps of this launch instead of at the end",
    )
    p.add_argument(
        "--resume",
        help="load the latest checkpoint from here first (default: --save-dir's, when it has "
        "one: a run restarted by `zerostream run --max_restarts` goes on from its newest save)",
    )
    p.add_argument("--out", default="train_gpt_out", help="plot and summary go here")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--verbose", action="store_true", help="keep the engine's per-step log beside the bar"
    )
    p.add_argument("--local_rank", type=int, default=-1, help="set by DeepSpeed-style launchers")
    p = deepspeed.add_config_arguments(p)
    args = p.parse_args(argv)
    if not args.deepspeed_config:
        p.error("--deepspeed_config is required (a ds_config.json; see configs/)")
    layers, hidden, heads, seq = SIZES[args.size]
    args.layers = args.layers or layers
    args.hidden = args.hidden or hidden
    args.heads = args.heads or heads
    args.seq = args.seq or seq
    return args


def load_config(args) -> dict:
    try:  # hjson, as DeepSpeed reads it: the recipes in configs/ carry comments
        cfg = hjson.loads(Path(args.deepspeed_config).read_text(), object_pairs_hook=dict)
    except (OSError, hjson.HjsonDecodeError) as exc:
        raise SystemExit(
            f"train_gpt: cannot read --deepspeed_config {args.deepspeed_config}: {exc}"
        ) from None
    if args.micro_batch:
        cfg["train_micro_batch_size_per_gpu"] = args.micro_batch
    if args.grad_accum:
        cfg["gradient_accumulation_steps"] = args.grad_accum
    if args.micro_batch or args.grad_accum:  # the batch rule derives it from the new values
        cfg.pop("train_batch_size", None)
    if args.lr is not None:
        cfg.setdefault("optimizer", {"type": "AdamW", "params": {}})["params"]["lr"] = args.lr
    zero = cfg.get("zero_optimization", {})
    for key in ("offload_optimizer", "offload_param"):
        if args.nvme_path and zero.get(key, {}).get("device") == "nvme":
            zero[key]["nvme_path"] = args.nvme_path
    args.micro_batch = cfg.get("train_micro_batch_size_per_gpu", 1)
    return cfg


# --- the loop -----------------------------------------------------------------------------------
def main(argv=None) -> int:
    args = parse_args(argv)
    deepspeed.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    cfg = load_config(args)
    stage = cfg.get("zero_optimization", {}).get("stage", 0)
    train_text, valid_text = read_corpus(args.corpus_mb)
    shape = GPTShape(args.layers, args.hidden, args.heads, VOCAB, args.seq)

    torch.manual_seed(args.seed)
    with deepspeed.zero.Init(config_dict_or_path=cfg, enabled=stage == 3):
        model = GPT(shape)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=cfg
    )
    device = engine.device
    if not args.verbose:  # the bar and the summary carry what the steps_per_print lines say
        logging.getLogger("zerostream").setLevel(logging.WARNING)
    if args.resume is None and args.save_dir:  # README "Several machines": the one line
        if os.path.exists(os.path.join(args.save_dir, "latest")):
            args.resume = args.save_dir
    if args.resume:
        path, _ = engine.load_checkpoint(args.resume)
        if path is None:
            raise SystemExit(f"train_gpt: --resume {args.resume}: no 'latest' checkpoint there")
        if rank == 0:
            print(f"resumed from {path} at step {engine.global_steps}", flush=True)

    gas = engine.gradient_accumulation_steps()
    tokens_per_step = engine.train_batch_size() * args.seq
    start_step = engine.global_steps
    history: Dict[str, List] = {"step": [], "loss": [], "eval": [], **{t: [] for t in TIERS}}
    history["eval"].append((start_step, validation_loss(engine, valid_text, args, device)))
    bar = _progress(rank, start_step, args.steps)
    tele = getattr(engine, "telemetry", None)
    begin, t0 = _counters(tele), time.perf_counter()
    for step in range(start_step, start_step + args.steps):
        before, t_step = _counters(tele), time.perf_counter()
        loss_sum = 0.0
        for micro in range(gas):
            x, y = micro_batch(train_text, step, micro, rank, args, device)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            loss_sum += float(loss.detach().float())
        loss_avg = _mean_over_ranks(loss_sum / gas, device)
        after, took = _counters(tele), time.perf_counter() - t_step
        history["step"].append(step + 1)
        history["loss"].append(loss_avg)
        for t in TIERS:
            history[t].append(after["bytes"].get(t, 0) - before["bytes"].get(t, 0))
        if (step + 1 - start_step) % args.eval_every == 0 or step + 1 == start_step + args.steps:
            history["eval"].append((step + 1, validation_loss(engine, valid_text, args, device)))
        if args.save_dir and args.save_at == step + 1 - start_step:
            _save(engine, args.save_dir, rank)
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(_postfix(loss_avg, tokens_per_step / took, after, begin))
    elapsed = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    if args.save_dir and args.save_at is None:
        _save(engine, args.save_dir, rank)

    peaks = _peaks_over_ranks(device)
    if rank == 0:
        summary = _summary(args, cfg, history, _counters(tele), begin, elapsed, peaks, world)
        summary["swap_files"] = _swap_files(cfg, rank)  # while the engine still holds them
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        print(_table(summary), flush=True)
        print(f"plot: {_plot(history, out / 'train_gpt.png', summary['config'])}", flush=True)
    dist.barrier()
    return 0


# --- reporting ------------------------------------------------------------------------------------
def _save(engine, save_dir: str, rank: int) -> None:
    engine.save_checkpoint(save_dir)
    if rank == 0:
        print(f"checkpoint: {save_dir}/global_step{engine.global_steps}", flush=True)


def _progress(rank: int, start: int, steps: int):
    if rank != 0:
        return None
    from tqdm import tqdm

    return tqdm(total=start + steps, initial=start, unit="step", dynamic_ncols=True)


def _counters(tele) -> dict:
    empty = {"seconds": {}, "bytes": {}, "tier_seconds": {}, "steps": 0}
    return tele.snapshot() if tele is not None and hasattr(tele, "snapshot") else empty


def _mean_over_ranks(value: float, device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t) / dist.get_world_size()


def _peaks_over_ranks(device) -> dict:
    """Largest peak RSS, device memory and host-arena peak over the ranks."""
    try:
        from zerostream.offload.host_buffers import arena_totals

        arena = arena_totals()
    except ImportError:  # DeepSpeed run
        arena = {"peak": 0, "budget": 0, "registered": 0, "register_failed": 0}
    dev = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t = torch.tensor(
        [rss, dev, arena["peak"], arena["budget"], arena["registered"], arena["register_failed"]],
        dtype=torch.float64,
    )
    t = t.to(device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    rss, dev, arena_peak, arena_budget, registered, refused = (int(v) for v in t.tolist())
    return {
        "peak_rss_bytes": rss,
        "peak_device_bytes": dev if device.type == "cuda" else None,
        "host_arena_peak_bytes": arena_peak,
        "host_arena_budget_bytes": arena_budget,
        # Ranges the GPU page-locked for DMA, and refused ones (their copies are synchronous).
        "host_registered": registered if device.type == "cuda" else None,
        "host_register_failed": refused if device.type == "cuda" else None,
    }


def _swap_files(cfg: dict, rank: int) -> dict:
    """What this rank's swap stores hold (bytes of live state) and what its swap files really
    occupy on the disk (st_blocks: allocated, preallocation included, sparse holes not): the
    proof that the offloaded state is on the disk."""
    zero = cfg.get("zero_optimization", {})
    paths = {
        zero[k]["nvme_path"]
        for k in ("offload_optimizer", "offload_param")
        if zero.get(k, {}).get("device") == "nvme"
    }
    out = {}
    for path in sorted(paths):
        files = [f for f in (Path(path) / "zerostream" / f"rank{rank}").rglob("*") if f.is_file()]
        out[path] = {
            "files": len(files),
            "allocated_bytes": sum(f.stat().st_blocks * 512 for f in files),
        }
    try:
        from zerostream.offload.swap_store import store_totals

        used = store_totals()["used_bytes"]
    except ImportError:  # DeepSpeed run
        used = None
    return {"paths": out, "state_bytes": used}


def _postfix(loss: float, tok_s: float, now: dict, begin: dict) -> str:
    moved = {t: (now["bytes"].get(t, 0) - begin["bytes"].get(t, 0)) / 1e6 for t in TIERS}
    nvme_r = moved["nvme_read"] + moved["param_nvme_read"]
    nvme_w = moved["nvme_write"] + moved["param_nvme_write"]
    return (
        f"loss {loss:.3f} | {tok_s:,.0f} tok/s | comm {moved['comm']:,.0f} MB"
        f" | nvme r {nvme_r:,.0f} MB w {nvme_w:,.0f} MB"
    )


def _summary(args, cfg, history, now, begin, elapsed, peaks, world) -> dict:
    d = {k: {t: now[k].get(t, 0) - begin[k].get(t, 0) for t in now[k]} for k in now if k != "steps"}
    zero = cfg.get("zero_optimization", {})
    precision = (
        "bf16"
        if cfg.get("bf16", {}).get("enabled")
        else "fp16"
        if cfg.get("fp16", {}).get("enabled")
        else "fp32"
    )
    losses, evals = history["loss"], history["eval"]
    head = losses[: max(1, len(losses) // 10)]
    tail = losses[-max(1, len(losses) // 10) :]
    tiers = {}
    for t in TIERS:
        nbytes = d["bytes"].get(t, 0)
        if nbytes:
            secs = d["tier_seconds"].get(t, 0.0)
            tiers[t] = {"gb": nbytes / 1e9, "gb_per_s": nbytes / secs / 1e9 if secs else None}
    return {
        "config": (
            f"{Path(args.deepspeed_config).name}: stage {zero.get('stage', 0)}, {precision}, "
            f"optimizer on {zero.get('offload_optimizer', {}).get('device', 'none')}, "
            f"params on {zero.get('offload_param', {}).get('device', 'none')}, {world} ranks"
        ),
        "model": (
            f"{args.layers} layers x {args.hidden} hidden x {args.heads} heads, seq {args.seq}"
        ),
        "steps": [history["step"][0] - 1, history["step"][-1]] if losses else [0, 0],
        "train_loss": [sum(head) / len(head), sum(tail) / len(tail)] if losses else None,
        "validation_loss": [evals[0][1], evals[-1][1]],
        "seconds": elapsed,
        "phase_seconds": {
            p: d["seconds"].get(p, 0.0)
            for p in ("forward", "backward", "reduce", "step", "swap_wait")
        },
        "tiers": tiers,
        "history": {"step": history["step"], "loss": history["loss"], "eval": history["eval"]},
        **peaks,
    }


def _table(s: dict) -> str:
    rows = [
        ("config", s["config"]),
        ("model", s["model"]),
        ("steps", f"{s['steps'][0]} -> {s['steps'][1]} in {s['seconds']:.1f} s"),
    ]
    if s["train_loss"]:
        rows.append(
            ("train loss", "{:.3f} -> {:.3f} (mean of first/last 10%)".format(*s["train_loss"]))
        )
    rows.append(("validation loss", "{:.3f} -> {:.3f}".format(*s["validation_loss"])))
    total = sum(s["phase_seconds"].values()) or 1.0
    rows.append(
        (
            "time by phase",
            ", ".join(
                f"{p} {v:.1f} s ({100 * v / total:.0f}%)" for p, v in s["phase_seconds"].items()
            ),
        )
    )
    rows.append(("peak RSS (max rank)", _size(s["peak_rss_bytes"])))
    rows.append(
        (
            "peak device memory",
            _size(s["peak_device_bytes"]) if s["peak_device_bytes"] else "n/a (CPU ranks)",
        )
    )
    rows.append(
        (
            "host arena peak",
            f"{_size(s['host_arena_peak_bytes'])} of {_size(s['host_arena_budget_bytes'])} budget",
        )
    )
    if s.get("host_registered") is not None:
        refused = s["host_register_failed"]
        rows.append(
            (
                "host memory for DMA",
                f"{s['host_registered']} ranges registered with the GPU (max rank), {refused} "
                + ("refused: their copies ran synchronously" if refused else "refused"),
            )
        )
    for t, v in s["tiers"].items():
        rate = f"{v['gb_per_s']:.2f} GB/s" if v["gb_per_s"] else "n/a"
        rows.append((t.replace("_", " "), f"{v['gb']:.3f} GB at {rate} (rank 0)"))
    swap = s.get("swap_files", {"paths": {}})
    for path, v in swap["paths"].items():
        held = "" if swap["state_bytes"] is None else f"{_size(swap['state_bytes'])} of state, "
        rows.append(
            (
                "swap files (rank 0)",
                f"{held}{_size(v['allocated_bytes'])} allocated in {v['files']} files under {path}",
            )
        )
    width = max(len(k) for k, _ in rows)
    return "\n".join(["== summary"] + [f"  {k:<{width}}  {v}" for k, v in rows])


def _size(nbytes) -> str:
    if nbytes is None:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def _plot(history, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    ax1.plot(history["step"], history["loss"], label="train (mean over ranks)")
    ax1.plot(*zip(*history["eval"]), "o-", label="validation")
    ax1.set_ylabel("loss")
    ax1.legend()
    ax1.set_title(title, fontsize=9)
    for t in TIERS:
        if any(history[t]):
            ax2.plot(history["step"], [b / 1e6 for b in history[t]], label=t.replace("_", " "))
    ax2.set_ylabel("MB per step (rank 0)")
    ax2.set_xlabel("optimizer step")
    if ax2.lines:
        ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.resolve()


if __name__ == "__main__":
    raise SystemExit(main())

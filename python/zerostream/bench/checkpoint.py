"""`zerostream bench checkpoint`: save and load of a large ZeRO-2 optimizer state against the
disk's own sequential bandwidth, measured by fio on the same directory in the same run.

A stack of bias-free Linear layers (`--params` parameters, bf16) is trained one step by a
one-rank engine (ZeRO stage 2, offload_optimizer cpu and/or nvme under `--path`), so the fp32
masters and both Adam moments exist: 12 bytes of optimizer state per parameter. Each repeat
then times `save_checkpoint` (state gathered, written, fsynced, committed) and, after the
files are dropped from the page cache (posix_fadvise DONTNEED on them only, so the load reads
the disk and other users of the machine keep their cache), `load_checkpoint`. Between repeats
fio writes and reads a file of the checkpoint's size in the same directory: O_DIRECT (the
disk) and buffered with a final fsync / a cold cache (the kernel path torch.save and
torch.load take). And in every round fio reads the checkpoint's own files cold, just before
or just after the load (alternately): the disk reading the same blocks within seconds of the
load, the steadiest peer on a disk shared with other jobs ("vs fio on its files", the median
of the per-round ratios). Figures are medians; ratios are zerostream over fio (STYLE.md item 15).
With nvme offload a save also reads the state from the swap files and a load writes it back,
on the same disk: "vs disk work" compares with fio moving all those bytes (checkpoint and
swap) at its O_DIRECT rates.

    zerostream bench checkpoint --path /nvme/tmp --params 250M --offload cpu nvme
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import time
from typing import Dict, List, Optional

import torch

from zerostream.bench import fio, stdout_to_stderr

from ..sizing import optimizer_state_bytes
from .memory import memory_status, peak_rss_bytes, reset_peak

# fp32 masters and both Adam moments (the bf16 run keeps DeepSpeed's default masters)
STATE_BYTES = optimizer_state_bytes(bf16_master=False, bf16_states=False)

_SCALE = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9}
WIDTH = 4096  # Linear(WIDTH, WIDTH): 16.8 M parameters per layer


def parse_count(text: str) -> int:
    t = str(text).strip().upper()
    unit = t[-1] if t and t[-1] in _SCALE else ""
    try:
        value = int(float(t[: len(t) - len(unit)]) * _SCALE[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count like 250M; got {text!r}") from None
    if value < WIDTH * WIDTH:
        raise argparse.ArgumentTypeError(f"--params must be at least {WIDTH * WIDTH}")
    return value


def _aio_section(text: str) -> dict:
    try:
        section = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--aio: not JSON ({exc})") from None
    if not isinstance(section, dict):
        raise argparse.ArgumentTypeError("--aio: expected a JSON object, the ds_config aio section")
    return section


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--path", required=True, help="directory on the disk to measure")
    p.add_argument("--params", type=parse_count, default=parse_count("250M"))
    p.add_argument("--offload", nargs="+", choices=("cpu", "nvme"), default=["cpu", "nvme"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-fio", action="store_true", help="skip the fio peer")
    p.add_argument(
        "--aio",
        type=_aio_section,
        default=None,
        help='the ds_config "aio" section the run uses, as JSON (e.g. \'{"queue_depth": 32}\'); '
        "checkpoint files and swap files stream through it",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


# --- the disk, measured by fio -----------------------------------------------------------------
def _fio(path: str, op: str, size: int, direct: bool, readonly: bool = False) -> float:
    options = [
        "--name=zs_bench_checkpoint",
        f"--filename={path}",
        f"--rw={op}",
        "--bs=1M",
        f"--size={size // (1 << 20) * (1 << 20)}",
        "--ioengine=psync",
        f"--direct={int(direct)}",
        "--invalidate=1",  # reads start from a cold cache
    ]
    if op == "write" and not direct:
        options.append("--end_fsync=1")  # as the checkpoint writer fsyncs each file
    if readonly:
        options.append("--readonly")
    return fio.gb_per_s(fio.run(options)[0], op)


def fio_read_files(paths: List[str]) -> float:
    """GB/s of fio reading these files (O_DIRECT, cold, whole MiB blocks), one after
    another: the disk reading the very blocks a load reads."""
    moved = seconds = 0.0
    for path in paths:
        size = os.path.getsize(path) // (1 << 20) * (1 << 20)
        if size:
            gbps = _fio(path, "read", size, True, readonly=True)
            moved, seconds = moved + size, seconds + size / gbps / 1e9
    return moved / seconds / 1e9 if seconds else 0.0


def fio_round(directory: str, size: int) -> Dict[str, float]:
    """GB/s of one sequential write and read pass, O_DIRECT and buffered."""
    path = os.path.join(directory, "zs_bench_checkpoint_fio.dat")
    try:
        return {
            "fio_write_direct": _fio(path, "write", size, True),
            "fio_read_direct": _fio(path, "read", size, True),
            "fio_write_buffered": _fio(path, "write", size, False),
            "fio_read_buffered": _fio(path, "read", size, False),
        }
    finally:
        if os.path.exists(path):
            os.unlink(path)


# --- zerostream --------------------------------------------------------------------------------
def _single_rank_env() -> None:
    """The launcher's variables for one local rank (initialize creates the Gloo group)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
    )


def build_engine(params: int, offload: str, directory: str, aio: Optional[dict] = None):
    """A trained-once stage-2 engine whose optimizer state lives on `offload`."""
    import zerostream

    _single_rank_env()
    torch.manual_seed(0)
    layers = max(1, params // (WIDTH * WIDTH))
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)))
    off = {"device": offload}
    if offload == "nvme":
        off["nvme_path"] = os.path.join(directory, "swap")
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 2, "offload_optimizer": off},
        "bf16": {"enabled": True},
    }
    if aio is not None:
        config["aio"] = aio
    engine, *_ = zerostream.initialize(model=model, config=config)
    x = torch.randn(2, WIDTH, dtype=torch.bfloat16)
    loss = engine(x).float().pow(2).mean()
    engine.backward(loss)
    engine.step()
    return engine, layers * WIDTH * WIDTH


def _files(directory: str) -> List[str]:
    return [os.path.join(root, f) for root, _, names in os.walk(directory) for f in names]


def drop_cache(directory: str) -> None:
    """Evicts these files' pages only (they are clean after the writer's fsync)."""
    for path in _files(directory):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _timed_with_peak(fn) -> tuple:
    """(seconds, bytes the RSS peaked above where it started; None where unmeasurable)."""
    base = memory_status().get("VmRSS")
    can = base is not None and reset_peak()
    start = time.perf_counter()
    fn()
    took = time.perf_counter() - start
    peak = memory_status().get("VmHWM") if can else None
    return took, (max(0, peak - base) if peak is not None else None)


def _swap_bytes(engine) -> tuple:
    """(read, written) bytes of the optimizer's swap store so far; (0, 0) without one."""
    swapper = getattr(engine.optimizer, "swapper", None)
    return (swapper.bytes_read, swapper.bytes_written) if swapper is not None else (0, 0)


def zs_round(engine, directory: str, fio_first: Optional[bool] = None) -> Dict[str, float]:
    """One save and one cold load. `fio_first` True/False: fio also reads the checkpoint's
    own files cold, before/after the load (alternated over the rounds, so neither side
    always finds the disk in the state the other left it); None: no fio."""
    ckpt = os.path.join(directory, "ckpt")
    before = _swap_bytes(engine)
    save_s, save_rss = _timed_with_peak(lambda: engine.save_checkpoint(ckpt, tag="bench"))
    middle = _swap_bytes(engine)
    tag = os.path.join(ckpt, "bench")
    paths = _files(tag)
    size = sum(os.path.getsize(f) for f in paths)
    files_gbps = None
    if fio_first:
        drop_cache(tag)
        files_gbps = fio_read_files(paths)
    drop_cache(tag)
    load_s, load_rss = _timed_with_peak(lambda: engine.load_checkpoint(ckpt, tag="bench"))
    after = _swap_bytes(engine)
    if fio_first is False:
        drop_cache(tag)
        files_gbps = fio_read_files(paths)
    shutil.rmtree(ckpt)
    row = {
        "bytes": size,
        # With nvme offload a save also reads the state from the swap files, and a load
        # writes it back to them: bytes the same disk moves besides the checkpoint's.
        "save_swap_bytes": middle[0] - before[0],
        "load_swap_bytes": after[1] - middle[1],
        "save_gbps": size / save_s / 1e9,
        "load_gbps": size / load_s / 1e9,
        "save_s": save_s,
        "load_s": load_s,
        # How far above the run's own memory the RSS peaked during each (bytes).
        "save_extra_rss": save_rss,
        "load_extra_rss": load_rss,
    }
    if files_gbps is not None:
        row["fio_read_files"] = files_gbps
        if not row["load_swap_bytes"]:  # nvme: "vs disk work" prices the swap writes too
            row["load_vs_fio_files"] = row["load_gbps"] / files_gbps
    return row


def measure(args, offload: str) -> dict:
    directory = os.path.join(args.path, f"zs_bench_checkpoint_{offload}")
    os.makedirs(directory, exist_ok=True)
    try:
        engine, numel = build_engine(args.params, offload, directory, args.aio)
        rounds: List[Dict[str, float]] = []
        for i in range(args.repeats):
            row = zs_round(engine, directory, None if args.no_fio else i % 2 == 1)
            if not args.no_fio:
                row.update(fio_round(directory, row["bytes"]))
            rounds.append(row)
        engine.destroy()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    med = {
        k: statistics.median(r[k] for r in rounds)
        for k in rounds[0]
        if all(r[k] is not None for r in rounds)
    }
    out = {"offload": offload, "params": numel, "optimizer_state_bytes": STATE_BYTES * numel, **med}
    for op in ("save", "load"):
        disk = "write" if op == "save" else "read"
        for kind in ("direct", "buffered"):
            fio = med.get(f"fio_{disk}_{kind}")
            out[f"{op}_vs_fio_{kind}"] = med[f"{op}_gbps"] / fio if fio else None
        out[f"{op}_vs_fio_disk"] = _vs_disk_work(med, op)
    out["rounds"] = rounds
    return out


def _vs_disk_work(med: dict, op: str) -> Optional[float]:
    """fio's time for all the bytes the disk moves in `op` (checkpoint and swap, O_DIRECT,
    one direction after the other: together they share the disk) over zerostream's time.
    With cpu offload it equals the plain O_DIRECT ratio."""
    write, read = med.get("fio_write_direct"), med.get("fio_read_direct")
    if not write or not read:
        return None
    swap = med.get(f"{op}_swap_bytes", 0)
    if op == "save":  # the state read from swap, the checkpoint written
        fio_s = swap / read / 1e9 + med["bytes"] / write / 1e9
    else:  # the checkpoint read, the state written to swap
        fio_s = med["bytes"] / read / 1e9 + swap / write / 1e9
    return fio_s / med[f"{op}_s"]


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _gb(n):
    return None if n is None else n / 1e9


def print_table(results: List[dict]) -> None:
    print(
        f"{'offload':8}{'op':6}{'GB':>7}{'swap GB':>9}{'zs GB/s':>9}{'fio direct':>12}"
        f"{'ratio':>7}{'vs disk work':>14}{'fio buffered':>14}{'ratio':>7}{'extra RSS GB':>14}"
        f"{'vs fio on its files':>21}"
    )
    for r in results:
        for op, disk in (("save", "write"), ("load", "read")):
            print(
                f"{r['offload']:8}{op:6}{r['bytes'] / 1e9:>7.2f}"
                f"{_fmt(_gb(r.get(f'{op}_swap_bytes'))):>9}{_fmt(r[f'{op}_gbps']):>9}"
                f"{_fmt(r.get(f'fio_{disk}_direct')):>12}{_fmt(r[f'{op}_vs_fio_direct']):>7}"
                f"{_fmt(r[f'{op}_vs_fio_disk']):>14}"
                f"{_fmt(r.get(f'fio_{disk}_buffered')):>14}"
                f"{_fmt(r[f'{op}_vs_fio_buffered']):>7}"
                f"{_fmt(_gb(r.get(f'{op}_extra_rss'))):>14}"
                f"{_fmt(r.get(f'{op}_vs_fio_files')):>21}"
            )


def run(args) -> int:
    if args.repeats < 1:
        print("bench checkpoint: --repeats must be >= 1", file=sys.stderr)
        return 2
    if not args.no_fio and not fio.available():
        print(f"bench checkpoint: {fio.MISSING}", file=sys.stderr)
        return 2
    os.makedirs(args.path, exist_ok=True)
    need = 3 * 14 * args.params  # swap files + checkpoint + fio file, with room
    free = shutil.disk_usage(args.path).free
    if need > free:
        print(
            f"bench checkpoint: about {need / 1e9:.1f} GB are needed under {args.path}; "
            f"{free / 1e9:.1f} GB are free",
            file=sys.stderr,
        )
        return 2
    config = {
        "path": args.path,
        "params": args.params,
        "offload": args.offload,
        "repeats": args.repeats,
        "stage": 2,
        "dtype": "bf16",
        "aio": args.aio,
    }
    if not args.json:
        print("bench checkpoint: " + json.dumps(config))
    results = []
    try:
        with stdout_to_stderr(args.json):
            for offload in args.offload:
                results.append(measure(args, offload))
    except (OSError, ValueError, RuntimeError) as e:
        print(f"bench checkpoint: {e}", file=sys.stderr)
        return 1
    peak = peak_rss_bytes()
    out = {"config": config, "results": results, "peak_rss_bytes": peak}
    if args.json:
        print(json.dumps(out))
        return 0
    print_table(results)
    print(f"peak RSS {peak / 1e9:.2f} GB")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="zerostream bench checkpoint", description=__doc__.splitlines()[0]
    )
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

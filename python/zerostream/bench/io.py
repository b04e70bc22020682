"""`zerostream bench io`: swap-engine bandwidth against fio (and DeepSpeed's aio handle).

Like DeepSpeed's ``ds_io`` / ``ds_nvme_tune``. One file under ``--path`` is laid out once and
then read and written with O_DIRECT (no page cache) by zerostream's engine and, in the same
run, by fio (io_uring, O_DIRECT, same block size, depth and jobs) and by DeepSpeed's
``aio_handle`` when DeepSpeed is importable. Each figure is the median over ``--loops``,
runs alternate between engines so drift hits all of them alike (STYLE.md item 15).

    python -m zerostream.bench.io --path /nvme/tmp --size 4G --block-size 1M --queue-depth 32
    python -m zerostream.bench.io --path /nvme/tmp --size 1G --sweep
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import time
from typing import Callable, Optional

import torch

from zerostream.bench import deepspeed_unavailable, fio, remember, stdout_to_stderr
from zerostream.offload.crc32c import crc32c
from zerostream.offload.host_buffers import HostArena, arena_bytes
from zerostream.offload.io_engine import BACKENDS, IoEngine, warnings_emitted
from zerostream.offload.memory_preflight import parse_bytes
from zerostream.offload.swap_store import SwapStore

CHUNK_BYTES = 256 << 20  # one request per chunk; the engine splits it into blocks


def parse_size(text: str) -> int:
    """'4G', '1M', '512K', '1048576' -> bytes (parse_bytes), positive, for argparse."""
    try:
        value = parse_bytes(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a size like 4G, 1M or 4096; got {text!r}")
    if value == 0:
        raise argparse.ArgumentTypeError(f"size must be positive; got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--path", required=True, help="directory on the device to measure")
    p.add_argument("--size", type=parse_size, default=parse_size("4G"), help="bytes per pass")
    p.add_argument("--block-size", type=parse_size, default=parse_size("1M"))
    p.add_argument("--queue-depth", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="aio.intra_op_parallelism / fio jobs")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--read", action="store_const", dest="mode", const="read")
    mode.add_argument("--write", action="store_const", dest="mode", const="write")
    mode.add_argument("--both", action="store_const", dest="mode", const="both")
    p.set_defaults(mode="both")
    p.add_argument("--loops", type=int, default=3)
    p.add_argument(
        "--sweep",
        action="store_true",
        help="try block sizes x depths x threads; print the best as an aio block",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument(
        "--register-buffers",
        action="store_true",
        help="register zerostream's buffer as an io_uring fixed buffer",
    )
    p.add_argument("--no-fio", action="store_true", help="skip the fio peer")
    p.add_argument("--keep", action="store_true", help="keep the benchmark file")


# --- engines -------------------------------------------------------------------------------
class Workload:
    """The file, its size and the shape of the I/O, shared by every engine."""

    def __init__(self, path: str, size: int, block: int, depth: int, threads: int):
        self.path, self.size, self.block, self.depth, self.threads = (
            path,
            size,
            block,
            depth,
            threads,
        )

    def chunks(self):
        for off in range(0, self.size, CHUNK_BYTES):
            yield off, min(CHUNK_BYTES, self.size - off)


def lay_out(path: str, size: int) -> None:
    """Allocates the file once so every timed pass overwrites, as fio does."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        buf = b"\x5a" * (1 << 20)
        for off in range(0, size, len(buf)):  # real blocks, not unwritten extents
            os.pwrite(fd, buf[: min(len(buf), size - off)], off)
        os.fsync(fd)
    finally:
        os.close(fd)


class ZeroStreamRunner:
    def __init__(self, w: Workload, backend: str, register: bool = False):
        self.w = w
        self.engine = IoEngine(
            block_size=w.block,
            queue_depth=w.depth,
            threads=w.threads,
            backend=backend,
            register_buffers=register,
        )
        self.arena = HostArena(min(CHUNK_BYTES, w.size) + (1 << 20))
        self.buf = self.arena.empty(min(CHUNK_BYTES, w.size))
        self.buf.fill_(0x5A)  # content is irrelevant to O_DIRECT; random_ costs CPU
        self.registered = register and self.engine.register_buffer(self.buf)

    def run(self, op: str) -> float:
        submit = self.engine.read if op == "read" else self.engine.write
        start = time.perf_counter()
        for off, n in self.w.chunks():
            submit(self.buf[:n], self.w.path, off)
        self.engine.wait_all()
        return self.w.size / (time.perf_counter() - start) / 1e9


class DeepSpeedRunner:
    """DeepSpeed's own aio handle, when DeepSpeed and its async_io op are available."""

    def __init__(self, w: Workload):
        why = deepspeed_unavailable()
        if why is not None:
            raise ImportError(why)
        from deepspeed.ops.op_builder import AsyncIOBuilder

        if not AsyncIOBuilder().is_compatible():
            raise RuntimeError("DeepSpeed's async_io op is not compatible here (libaio?)")
        self.w = w
        self.h = (
            AsyncIOBuilder()
            .load(verbose=False)
            .aio_handle(w.block, w.depth, False, True, w.threads)
        )
        n = min(CHUNK_BYTES, w.size)
        self.buf = self.h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))

    def run(self, op: str) -> float:
        call = self.h.async_pread if op == "read" else self.h.async_pwrite
        start = time.perf_counter()
        for off, n in self.w.chunks():
            call(self.buf[:n], self.w.path, off)
        self.h.wait()
        return self.w.size / (time.perf_counter() - start) / 1e9


class StoreRunner:
    """The swap store as the optimizer drives it: tensors of STORE_CHUNK bytes through a ring
    of STORE_RING buffers (a buffer is reused once its request finished), with or without
    zerostream.verify_swap_checksums, so the checksums' cost is what a run pays."""

    STORE_CHUNK = 64 << 20
    STORE_RING = 4

    def __init__(self, w: Workload, backend: str, checksums: bool):
        chunk = min(self.STORE_CHUNK, w.size)
        self.count = max(1, w.size // chunk)
        self.bytes = self.count * chunk
        self.engine = IoEngine(
            block_size=w.block, queue_depth=w.depth, threads=w.threads, backend=backend
        )
        self.arena = HostArena(self.STORE_RING * arena_bytes(chunk))
        self.ring = [self.arena.empty(chunk) for _ in range(self.STORE_RING)]
        for i, b in enumerate(self.ring):
            b.fill_(i + 1)
        name = "bench-crc" if checksums else "bench"
        root = os.path.dirname(w.path)
        self.store = SwapStore(
            self.engine, root, name=name, verify_checksums=checksums, grow_bytes=0
        )
        self._pass("write")  # lay the extents out once: timed passes overwrite

    def _pass(self, op: str) -> None:
        submit = self.store.read if op == "read" else self.store.write
        pending: list = [None] * self.STORE_RING
        for i in range(self.count):
            k = i % self.STORE_RING
            if pending[k] is not None:
                pending[k].wait()
            pending[k] = submit(i, self.ring[k])
        for t in pending:
            if t is not None:
                t.wait()

    def run(self, op: str) -> float:
        start = time.perf_counter()
        self._pass(op)
        return self.bytes / (time.perf_counter() - start) / 1e9

    def close(self) -> None:
        self.store.close()  # its files and the empty directories it made


def checksum_cost(w: Workload, ops: list[str], loops: int, backend: str) -> dict:
    """Swap-store bandwidth with and without checksums, alternating, and the CRC32C rate of
    one core over a buffer; cost = 1 - with / without (the docs promise <= 5%)."""
    runners = {False: StoreRunner(w, backend, False), True: StoreRunner(w, backend, True)}
    try:
        samples = {(c, op): [] for c in runners for op in ops}
        for loop in range(loops):
            for op in ops:
                for c in (loop % 2 == 0, loop % 2 == 1):
                    samples[(c, op)].append(runners[c].run(op))
        buf = runners[True].ring[0]
        start = time.perf_counter()
        crc32c(buf)
        crc_rate = buf.numel() / (time.perf_counter() - start) / 1e9
    finally:
        for r in runners.values():
            r.close()
    out = {"crc32c_gbps_one_core": round(crc_rate, 3)}
    for op in ops:
        plain = statistics.median(samples[(False, op)])
        crc = statistics.median(samples[(True, op)])
        out[f"store_{op}_gbps"] = round(plain, 4)
        out[f"store_{op}_checksummed_gbps"] = round(crc, 4)
        out[f"checksum_cost_{op}"] = round(1 - crc / plain, 4)
    return out


def fio_command(w: Workload, op: str) -> list[str]:
    """fio's options for the swap engine's pattern (fio.run adds the JSON output)."""
    per_job = w.size // w.threads // w.block * w.block
    return [
        "--name=zs_bench_io",
        f"--filename={w.path}",
        f"--rw={op}",
        f"--bs={w.block}",
        f"--iodepth={w.depth}",
        f"--numjobs={w.threads}",
        f"--size={per_job}",
        f"--offset_increment={per_job}",
        "--ioengine=io_uring",
        "--direct=1",
        "--group_reporting",
    ]


class FioRunner:
    def __init__(self, w: Workload):
        if not fio.available():  # said when the peer is set up, not at its first run
            raise RuntimeError(fio.MISSING)
        self.w = w

    def run(self, op: str) -> float:
        return fio.gb_per_s(fio.run(fio_command(self.w, op), timeout=900)[0], op)


# --- measurement ------------------------------------------------------------------------------
def _try(make: Callable[[], object], name: str, notes: list[str]) -> Optional[object]:
    try:
        return make()
    except Exception as e:  # noqa: BLE001 - a missing peer is reported, not fatal
        notes.append(f"{name}: skipped ({type(e).__name__}: {e})")
        return None


def measure(
    w: Workload,
    ops: list[str],
    loops: int,
    backend: str,
    peers: bool,
    notes: list[str],
    register: bool = False,
) -> dict:
    runners = {"zerostream": ZeroStreamRunner(w, backend, register)}
    if peers:
        for name, make in (
            ("fio", lambda: FioRunner(w)),
            ("deepspeed", lambda: DeepSpeedRunner(w)),
        ):
            r = _try(make, name, notes)
            if r is not None:
                runners[name] = r
    samples = {(name, op): [] for name in runners for op in ops}
    for loop in range(loops):
        for op in ops:
            # Rotate which engine goes first so cache and drift effects hit all alike.
            order = list(runners.items())
            k = loop % len(order)
            for name, r in order[k:] + order[:k]:
                if name not in runners:
                    continue
                try:
                    samples[(name, op)].append(r.run(op))
                except Exception as e:  # noqa: BLE001
                    if name == "zerostream":
                        raise
                    notes.append(f"{name} {op}: failed ({e}); dropped")
                    del runners[name]
    zs = runners["zerostream"]
    result = {"backend": zs.engine.backend, "registered_buffers": bool(zs.registered)}
    for (name, op), vals in samples.items():
        prefix = "" if name == "zerostream" else f"{name}_"
        result[f"{prefix}{op}_gbps"] = round(statistics.median(vals), 4) if vals else None
    result["samples_gbps"] = {
        f"{name}_{op}": [round(v, 4) for v in vals] for (name, op), vals in samples.items()
    }
    return result


def with_ratios(res: dict) -> dict:
    for op in ("read", "write"):
        for peer, key in (("fio", "vs_fio"), ("deepspeed", "vs_deepspeed")):
            ours, theirs = res.get(f"{op}_gbps"), res.get(f"{peer}_{op}_gbps")
            res[f"{op}_ratio_{key}"] = round(ours / theirs, 4) if ours and theirs else None
        res.setdefault(f"fio_{op}_gbps", None)
        res.setdefault(f"{op}_gbps", None)
    return res


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def print_table(res: dict, ops: list[str]) -> None:
    print(f"{'':7}{'zerostream':>12}{'fio':>9}{'zs/fio':>9}{'deepspeed':>11}{'zs/ds':>8}  (GB/s)")
    for op in ops:
        print(
            f"{op:7}{_fmt(res.get(f'{op}_gbps')):>12}{_fmt(res.get(f'fio_{op}_gbps')):>9}"
            f"{_fmt(res.get(f'{op}_ratio_vs_fio')):>9}"
            f"{_fmt(res.get(f'deepspeed_{op}_gbps')):>11}"
            f"{_fmt(res.get(f'{op}_ratio_vs_deepspeed')):>8}"
        )


def sweep(args, path: str, ops: list[str], notes: list[str]) -> dict:
    """zerostream alone over block size x depth x threads; best by read + write sum, as
    ds_nvme_tune picks."""
    grid = list(itertools.product([256 << 10, 1 << 20, 4 << 20], [8, 32, 128], [1, 2]))
    rows = []
    for block, depth, threads in grid:
        w = Workload(path, args.size, block, depth, threads)
        r = measure(w, ops, max(1, args.loops), args.backend, False, notes)
        total = sum(r.get(f"{op}_gbps") or 0 for op in ops)
        rows.append(
            {
                "block_size": block,
                "queue_depth": depth,
                "intra_op_parallelism": threads,
                **{f"{op}_gbps": r[f"{op}_gbps"] for op in ops},
                "sum": round(total, 4),
            }
        )
        if not args.json:
            print(
                f"  block {block >> 10:>5}K depth {depth:>4} threads {threads}: "
                + "  ".join(f"{op} {r[f'{op}_gbps']:.3f}" for op in ops)
            )
    best = max(rows, key=lambda r: r["sum"])
    aio = {
        "block_size": best["block_size"],
        "queue_depth": best["queue_depth"],
        "intra_op_parallelism": best["intra_op_parallelism"],
        "single_submit": False,
        "overlap_events": True,
    }
    return {"sweep": rows, "best": best, "aio": aio}


def run(args) -> int:
    ops = ["read", "write"] if args.mode == "both" else [args.mode]
    if args.loops < 1 or args.queue_depth < 1 or args.threads < 1:
        print("bench io: --loops, --queue-depth and --threads must be >= 1", file=sys.stderr)
        return 2
    os.makedirs(args.path, exist_ok=True)
    free = shutil.disk_usage(args.path).free
    if args.size > free:
        print(
            f"bench io: --size {args.size} bytes does not fit in {args.path} ({free} bytes free)",
            file=sys.stderr,
        )
        return 2
    path = os.path.join(args.path, "zs_bench_io.dat")
    notes: list[str] = []
    config = {
        "path": path,
        "size": args.size,
        "block_size": args.block_size,
        "queue_depth": args.queue_depth,
        "threads": args.threads,
        "loops": args.loops,
        "mode": args.mode,
        "backend": args.backend,
        "o_direct": True,
    }
    if not args.json:
        print("bench io: " + json.dumps(config))
    try:
        with stdout_to_stderr(args.json):  # peers (DeepSpeed) log to stdout
            lay_out(path, args.size)
            if args.sweep:
                out = sweep(args, path, ops, notes)
            else:
                w = Workload(path, args.size, args.block_size, args.queue_depth, args.threads)
                out = with_ratios(
                    measure(
                        w,
                        ops,
                        args.loops,
                        args.backend,
                        not args.no_fio,
                        notes,
                        args.register_buffers,
                    )
                )
                out["checksums"] = checksum_cost(w, ops, args.loops, args.backend)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"bench io: {e}", file=sys.stderr)
        return 1
    finally:
        if not args.keep and os.path.exists(path):
            os.unlink(path)
    out["config"] = config
    out["notes"] = notes + [w for w in warnings_emitted()]
    remember("io", out)  # this machine's disk rates for `zerostream estimate`
    if args.json:
        print(json.dumps(out))
        return 0
    if args.sweep:
        print(f"best (read + write): {json.dumps(out['best'])}")
        print(json.dumps({"aio": out["aio"]}, indent=2))
    else:
        print_table(out, ops)
        c = out["checksums"]
        print(
            "swap store, zerostream.verify_swap_checksums on vs off: "
            + "  ".join(
                f"{op} {c[f'store_{op}_checksummed_gbps']:.3f} vs {c[f'store_{op}_gbps']:.3f}"
                f" GB/s (cost {100 * c[f'checksum_cost_{op}']:.1f}%)"
                for op in ops
            )
            + f"; CRC32C {c['crc32c_gbps_one_core']:.1f} GB/s on one core"
        )
    for n in out["notes"]:
        print(f"note: {n}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="zerostream bench io", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

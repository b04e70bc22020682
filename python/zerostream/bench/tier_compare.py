"""`zerostream bench capacity --compare-tiers`: the same model all on NVMe and tiered, each in its
own process (its own peak RSS), then the disk measured by fio on the same directory: each
run's step against the disk-bound floor of the bytes it moves (Note [The disk-bound floor]).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List

from . import fio

# Note [The disk-bound floor]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A step that reads R bytes and writes W bytes of swap cannot take less than the disk needs
# for them. fio measures the three rates that bound it, in 1 MiB pieces with O_DIRECT like the
# engine, at 32 in flight (the I/O engine's own default depth; the bench's swap runs at its
# ds_config's aio.queue_depth, DeepSpeed's 8, at which fio measured this VM's disk slower,
# 0.71 / 1.39 GB/s read / write against 0.84 / 2.22, so the floor stays a lower bound):
# reading alone (r), writing alone (w), and one job reading while another writes a second
# file (rc + wc, the disk's combined rate when both directions are busy, as in the
# optimizer's pipelined step). The floor is
#     max(R / r, W / w, (R + W) / (rc + wc)).
# A floor of R / r + W / w with depth-1 rates bounds nothing: on a virtual disk whose reads and
# writes proceed together (and whose write rate grows with the depth: 0.99 GB/s at depth 1,
# 2.2 at 32 on this VM) both runs of a compare beat it. A step above the floor by
# much more than its compute (forward and backward with every shard in host memory move no
# disk bytes) is waiting on something other than the disk.
# The disk is shared (a virtual disk): one fio sample, taken once after both runs, measured
# concurrent writes at a quarter of an earlier run's, and both runs beat the floor it gave. So fio
# samples the disk before the runs and after them, and each rate is taken at its best of
# the two (the concurrent pair from one sample): a slow moment of the disk never raises the
# floor.
QUEUE_DEPTH = 32


def _fio_jobs(jobs: Dict[str, tuple], size: int, depth: int, seconds: int = 0) -> Dict[str, float]:
    """Runs the named jobs ({name: (rw, path)}) together in one fio invocation, each over
    `size` bytes, or for `seconds` (looping over them) when given, so that jobs run together
    all the time they are measured; GB/s of each (its own direction)."""
    options = [
        "--bs=1M",
        f"--size={size // (1 << 20) * (1 << 20)}",
        "--ioengine=libaio",
        f"--iodepth={depth}",
        "--direct=1",
        "--invalidate=1",  # reads start from a cold cache
    ]
    if seconds:
        options += [f"--runtime={seconds}", "--time_based"]
    for name, (rw, path) in jobs.items():
        options += [f"--name={name}", f"--rw={rw}", f"--filename={path}"]
    return {j["jobname"]: fio.gb_per_s(j, jobs[j["jobname"]][0]) for j in fio.run(options)}


def measure_disk(directory: str, size: int, depth: int = QUEUE_DEPTH) -> Dict[str, float]:
    """The rates of Note [The disk-bound floor], measured with two probe files of `size`
    bytes under `directory` (removed after)."""
    a, b = os.path.join(directory, "fio.probe.a"), os.path.join(directory, "fio.probe.b")
    try:
        w = _fio_jobs({"w": ("write", a)}, size, depth)["w"]
        r = _fio_jobs({"r": ("read", a)}, size, depth)["r"]
        # Timed, so that neither runs alone at the end of the other.
        both = _fio_jobs({"r": ("read", a), "w": ("write", b)}, size, depth, seconds=10)
    finally:
        for path in (a, b):
            if os.path.exists(path):
                os.unlink(path)
    return {
        "read_gb_per_s": round(r, 3),
        "write_gb_per_s": round(w, 3),
        "concurrent_read_gb_per_s": round(both["r"], 3),
        "concurrent_write_gb_per_s": round(both["w"], 3),
        "queue_depth": depth,
    }


CONCURRENT = ("concurrent_read_gb_per_s", "concurrent_write_gb_per_s")


def fastest(samples: List[Dict[str, float]]) -> Dict[str, float]:
    """Each rate at its best over the samples (Note [The disk-bound floor]): the floor is a
    lower bound, so a slow sample must not raise it. The two rates of reading while writing
    come as a pair from the sample whose sum is the highest: one sample's read with
    another's write is a combined rate the disk never showed."""
    best = {k: max(s[k] for s in samples) for k in samples[0]}
    pair = max(samples, key=lambda s: sum(s[k] for k in CONCURRENT))
    best.update({k: pair[k] for k in CONCURRENT})
    return best


def _probe_bytes(work: int) -> int:
    """fio moves about what a step moves: at least 256 MiB, at most 4 GiB."""
    return min(4 << 30, max(256 << 20, work))


def _params(args) -> int:
    """The model's parameter count."""
    from .corpus import vocabulary
    from .gpt import GPTShape

    vocab = vocabulary(args.corpus_mb, args.vocab)
    return GPTShape(args.layers, args.hidden, args.heads, vocab, args.seq).params


def floor_seconds(read: int, written: int, disk: Dict[str, float]) -> float:
    """Note [The disk-bound floor]: the least time the disk needs to read `read` and write
    `written` bytes."""
    both = disk["concurrent_read_gb_per_s"] + disk["concurrent_write_gb_per_s"]
    return (
        max(
            read / disk["read_gb_per_s"],
            written / disk["write_gb_per_s"],
            (read + written) / both,
        )
        / 1e9
    )


def _steady_steps(res: dict) -> list:
    """The steps after the one whose end saw every tier placed (the last half of them, for
    a run that reports no placement); never the first step."""
    times, settled = res["step_seconds"], res.get("tiers_settled_after_step")
    if settled and any(settled):
        first = max(1, settled.index(True) + 1)
        if first < len(times):
            return times[first:]
    return times[len(times) // 2 :]


_PASSED = (
    "layers",
    "hidden",
    "heads",
    "vocab",
    "seq",
    "micro_batch",
    "steps",
    "corpus_mb",
    "lr",
    "warmup_steps",
    "sub_group_size",
    "buffer_size",
    "max_live",
    "host_malloc",
    "overlap_step",
)


def _child(args, max_in_cpu: str, param_in_cpu: str, nvme: str) -> dict:
    """One configuration in its own process (its own peak RSS), as --json prints it."""
    cmd = [sys.executable, "-m", "zerostream.cli", "bench", "capacity", "--json"]
    for name in _PASSED:
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    cmd += ["--optimizer-max-in-cpu", max_in_cpu, "--param-max-in-cpu", param_in_cpu]
    cmd += ["--nvme-path", nvme]
    if args.bf16:
        cmd.append("--bf16")
    if args.bf16_masters:
        cmd.append("--bf16-masters")
    if args.bf16_states:
        cmd.append("--bf16-states")
    if args.wide_matmul:
        cmd.append("--wide-matmul")
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode not in (0, 1) or not lines:  # 1: ran, but a verdict failed (reported)
        raise RuntimeError(
            f"bench capacity (optimizer {max_in_cpu}, params {param_in_cpu}) exited "
            f"{done.returncode} without its result:\n{done.stderr[-3000:]}"
        )
    return json.loads(lines[-1])


def _per_step_bytes(res: dict) -> Dict[str, int]:
    return {tier: m["bytes"] for tier, m in res["last_step_moved"].items()}


def compare(args) -> dict:
    """Both configurations (`--rounds` times, alternating which goes first), then fio on the
    same directory: each run's disk bytes per step give the disk-bound floor of its step
    (Note [The disk-bound floor]). The speedup is the median over rounds of each round's
    ratio of the two runs' steady medians; `runs` holds the first round's runs whole."""
    if args.rounds < 1:
        raise ValueError(f"--rounds: expected >= 1; got {args.rounds}")
    root = args.nvme_path or tempfile.mkdtemp(prefix="zs-capacity-")
    try:
        # The tiered run: the given tiers, "auto" for a flag not given.
        opt, par = (
            v if v is not None else "auto"
            for v in (args.optimizer_max_in_cpu, args.param_max_in_cpu)
        )
        pair = (("all_nvme", ("0", "0")), ("tiered", (opt, par)))
        # The disk is sampled before the runs and after (Note [The disk-bound floor]); the
        # size is a guess before them: the model's bf16 parameters, read and written.
        os.makedirs(root, exist_ok=True)
        samples = [measure_disk(root, _probe_bytes(2 * 2 * _params(args)))]
        rounds = []
        for r in range(args.rounds):
            got = {}
            for name, (opt, par) in pair if r % 2 == 0 else pair[::-1]:
                got[name] = _child(args, opt, par, os.path.join(root, name))
                got[name]["round"] = r
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            rounds.append(got)
        runs = rounds[0]
        work = sum(_per_step_bytes(runs["all_nvme"]).values())
        samples.append(measure_disk(root, _probe_bytes(work)))
        disk = fastest(samples)
    finally:
        if args.nvme_path is None:
            shutil.rmtree(root, ignore_errors=True)
    for res in (res for got in rounds for res in got.values()):
        moved = _per_step_bytes(res)
        read = sum(b for t, b in moved.items() if t.endswith("nvme_read"))
        written = sum(b for t, b in moved.items() if t.endswith("nvme_write"))
        res["disk_bytes_per_step"] = {"read": read, "written": written}
        res["floor_seconds"] = round(floor_seconds(read, written, disk), 2)
        # "auto" places the tiers between steps (Note ["auto" is sized from a measured step]):
        # both runs are compared over the steps after every tier was placed.
        late = _steady_steps(res)
        res["steady_steps"] = len(late)
        res["median_step_seconds"] = sorted(late)[len(late) // 2]
        res["over_floor"] = (
            round(res["median_step_seconds"] / res["floor_seconds"], 3)
            if res["floor_seconds"]
            else None
        )
        pred = res.get("optimizer_tiers", {}).get("prediction")
        if pred:  # "auto" predicted the steady step when it placed: how close it came
            res["predicted_over_measured"] = round(
                pred["predicted_step_seconds"] / res["median_step_seconds"], 3
            )
    ratios = [
        round(got["all_nvme"]["median_step_seconds"] / got["tiered"]["median_step_seconds"], 3)
        for got in rounds
    ]
    return {
        "disk": disk,
        "disk_samples": samples,
        "runs": runs,
        "rounds": [
            {
                "first": "all_nvme" if r % 2 == 0 else "tiered",
                "all_nvme_median_s": got["all_nvme"]["median_step_seconds"],
                "tiered_median_s": got["tiered"]["median_step_seconds"],
                "speedup": ratio,
            }
            for r, (got, ratio) in enumerate(zip(rounds, ratios))
        ],
        "tiered_speedup": sorted(ratios)[len(ratios) // 2],
        "same_losses": all(
            got[name]["losses"] == runs["all_nvme"]["losses"] for got in rounds for name in got
        ),
    }


def print_compare(res: dict) -> None:
    d = res["disk"]
    print(
        f"fio on the swap directory (depth {d['queue_depth']}): read {d['read_gb_per_s']:.2f} "
        f"GB/s, write {d['write_gb_per_s']:.2f} GB/s, both at once "
        f"{d['concurrent_read_gb_per_s']:.2f} + {d['concurrent_write_gb_per_s']:.2f} GB/s"
    )
    for name, r in res["runs"].items():
        b, ot = r["disk_bytes_per_step"], r["optimizer_tiers"]
        print(
            f"{name}: step {r['median_step_seconds']} s (all {r['step_seconds']}), disk "
            f"{b['read'] / 1e9:.1f} GB read + {b['written'] / 1e9:.1f} GB written per step, "
            f"floor {r['floor_seconds']} s (x{r['over_floor']}), optimizer state in host memory "
            f"{ot['host_elements']} of {ot['host_elements'] + ot['nvme_elements']} elements, "
            f"peak RSS {r['peak_rss_gib']} GiB (budget {r['host_budget_gib']}), losses "
            f"{[round(x, 4) for x in r['losses']]}"
        )
        pred = ot.get("prediction")
        if pred:
            print(
                f'  "auto" predicted {pred["predicted_step_seconds"]} s a step when it placed '
                f"the optimizer tier: x{r['predicted_over_measured']} of the measured median; "
                f"peak RSS {r['predicted_peak_rss_gib']} GiB: the placed steps peaked at "
                f"{r['placed_peak_rss_gib']} (x{r['placed_peak_over_predicted']})"
            )
    if len(res["rounds"]) > 1:
        for i, r in enumerate(res["rounds"]):
            print(
                f"round {i} ({r['first']} first): all on NVMe {r['all_nvme_median_s']} s, "
                f"tiered {r['tiered_median_s']} s, {r['speedup']}x"
            )
    print(
        f"tiered over all on NVMe: {res['tiered_speedup']}x faster (median over "
        f"{len(res['rounds'])} round(s)); same losses: {res['same_losses']}"
    )

"""The machine the planner sizes for: GPUs, memories, and the rates of the links a step's
bytes cross. Every rate carries where it came from (a flag, a measurement file of this
machine, or a documented default) and the planner prints that source beside it.

Measurements are the JSON objects `zerostream bench io --json`, `zerostream bench optim
--json` (or its --json-out file) and `zerostream bench step --json` print. They are read
from --measured FILE and from the cache directory $ZEROSTREAM_CACHE_DIR (default
~/.cache/zerostream), files bench-io.json, bench-optim.json, bench-step.json, which each
benchmark writes there after every run (`zerostream bench io --path /local_nvme` is enough).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Dict, Iterable, List, Optional

from .units import GB, GIB

# name -> (value, unit, why). GPU runs; CPU-only runs override some (CPU_DEFAULTS).
DEFAULTS = {
    "nvme_read": (6.0, "GB/s per node", "default: one PCIe 4.0 NVMe SSD, sequential read"),
    "nvme_write": (5.0, "GB/s per node", "default: one PCIe 4.0 NVMe SSD, sequential write"),
    "pcie": (25.0, "GB/s per GPU each way", "default: PCIe 4.0 x16, pinned memory"),
    "cpu_adam": (5.0, "Gparam/s per node", "default: fused CPU Adam on a many-core host"),
    "collective": (
        150.0,
        "GB/s per GPU",
        "assumption: NVLink all-gather/reduce-scatter bus bandwidth within a node",
    ),
    "net": (25.0, "GB/s per node", "assumption: 200 Gb/s between nodes"),
    "collective_latency_us": (
        3.0,
        "us per ring hop",
        "assumption: NCCL over NVLink, small-message latency of one hop",
    ),
    "net_latency_us": (10.0, "us per ring hop", "assumption: NCCL over InfiniBand or RoCE"),
    "peak_tflops": (312.0, "TFLOP/s per GPU", "assumption: A100 bf16 dense peak"),
}
CPU_DEFAULTS = {
    "collective": (5.0, "GB/s per process", "assumption: Gloo over shared memory"),
    "collective_latency_us": (60.0, "us per ring hop", "assumption: Gloo over TCP loopback"),
    "net_latency_us": (60.0, "us per ring hop", "assumption: Gloo over TCP"),
    "peak_tflops": (
        0.064,
        "TFLOP/s per core",
        "assumption: AVX-512 fp32 FMA at 2 GHz, times the cores",
    ),
}
# Host memory a training process takes beyond the model's tensors (Python, torch, its
# libraries and allocator caches). CPU: measured here (benchmarks/estimate.md: a 15 K-param
# GPT through `zerostream bench step`, torch 2.15: 0.68 GiB). GPU: assumption (CUDA
# libraries and context add about 2 GB of host memory to a torch process).
HOST_OVERHEAD = {"cpu": int(0.73 * GB), "gpu": int(3.0 * GB)}
# Device memory neither the model nor zerostream allocates: CUDA context, NCCL, cuBLAS
# workspaces, the caching allocator's fragmentation. Assumption.
GPU_RESERVE = int(2.0 * GB)
# Host memory a job cannot count on: the OS, its daemons, the data loaders' workers and the
# page cache the checkpoint writer goes through. A plan that fills the last few percent of
# RAM (70B with 16-bit offloaded gradients: 990 of 1000 GB) is one swapping away from the
# OOM killer. Assumption.
HOST_RESERVE_FRACTION = 0.05

CACHE_FILES = ("bench-io.json", "bench-optim.json", "bench-step.json")


@dataclass(frozen=True)
class Rate:
    value: float
    unit: str
    source: str


@dataclass(frozen=True)
class Machine:
    gpus_per_node: int  # data-parallel processes per node (CPU-only: processes)
    nodes: int
    gpu_mem: int  # bytes per GPU (0 with cpu_only)
    cpu_mem: int  # bytes per node
    nvme: int  # bytes per node
    cpu_only: bool
    rates: Dict[str, Rate]
    host_overhead: int  # bytes per process
    gpu_reserve: int  # bytes per GPU

    @property
    def host_usable(self) -> int:
        """Bytes per node a job may plan to use (HOST_RESERVE_FRACTION kept free)."""
        return int(self.cpu_mem * (1 - HOST_RESERVE_FRACTION))

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes

    def rate(self, name: str) -> float:
        return self.rates[name].value

    def describe(self) -> str:
        if self.cpu_only:
            head = f"{self.nodes} node(s) x {self.gpus_per_node} CPU process(es), no GPU"
        else:
            head = (
                f"{self.nodes} node(s) x {self.gpus_per_node} GPU(s) x {self.gpu_mem / GB:.1f} GB"
            )
        return f"{head}; host {self.cpu_mem / GB:.0f} GB, NVMe {self.nvme / GB:.0f} GB per node"


def _measured_rates(obj: dict, path: str) -> Dict[str, float]:
    """Rates a bench JSON object measured, by planner rate name; {} when none apply."""
    out: Dict[str, float] = {}
    if "best" in obj and isinstance(obj["best"], dict):  # bench io --sweep
        obj = {**obj, **obj["best"]}
    if obj.get("read_gbps"):
        out["nvme_read"] = float(obj["read_gbps"])
    if obj.get("write_gbps"):
        out["nvme_write"] = float(obj["write_gbps"])
    if obj.get("params_per_s") and obj.get("bytes_per_param"):  # bench optim
        out["cpu_adam"] = float(obj["params_per_s"]) / 1e9  # with the run's threads
    peers = obj.get("peers")
    if isinstance(peers, dict):  # bench step: the swap links' rates of our run
        ours = peers.get("zerostream") or {}
        links = ours.get("links") or {}
        for tier, name in (("nvme_read", "nvme_read"), ("nvme_write", "nvme_write")):
            rate = (links.get(tier) or {}).get("gb_per_s")
            if rate:
                out.setdefault(name, float(rate))
        # The copy stage's lanes, timed on the GPU: the slower direction is the link's rate.
        # (On a machine without one they are host memcpy, not a PCIe link.)
        lanes = [(links.get(t) or {}).get("gb_per_s") for t in ("h2d", "d2h")]
        if str(ours.get("device", "")).startswith("cuda") and all(lanes):
            out.setdefault("pcie", float(min(lanes)))
    return out


def load_measurements(paths: Iterable[str], required: bool) -> Dict[str, Rate]:
    """Rates from bench JSON files; a `required` (given on the command line) file that is
    missing, not JSON, or measured nothing the planner uses is an error naming it."""
    rates: Dict[str, Rate] = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                obj = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            if required:
                raise ValueError(f"--measured: cannot read {path!r}: {exc}") from exc
            continue
        found = _measured_rates(obj, path) if isinstance(obj, dict) else {}
        if not found and required:
            raise ValueError(
                f"--measured: {path} holds no rate the planner uses (expected the JSON of "
                f"`zerostream bench io|optim|step --json`)"
            )
        for name, value in found.items():
            unit = DEFAULTS[name][1]
            rates[name] = Rate(value, unit, f"measured: {path}")
    return rates


def cache_files() -> List[str]:
    """The result files `zerostream bench io|optim|step` leave behind (bench.remember)."""
    from ..bench import cache_dir

    return [os.path.join(cache_dir(), name) for name in CACHE_FILES]


def build_machine(
    *,
    gpus_per_node: int,
    nodes: int,
    gpu_mem: int,
    cpu_mem: int,
    nvme: int,
    cpu_only: bool = False,
    flags: Optional[Dict[str, Optional[float]]] = None,
    measured: Iterable[str] = (),
    use_cache: bool = True,
    host_overhead: Optional[int] = None,
    gpu_reserve: Optional[int] = None,
) -> Machine:
    """Flags win over measurements, measurements over defaults."""
    if gpus_per_node < 1 or nodes < 1:
        raise ValueError("--gpus and --nodes: expected counts >= 1")
    rates: Dict[str, Rate] = {}
    cores = os.cpu_count() or 1
    for name, (value, unit, why) in DEFAULTS.items():
        if cpu_only and name in CPU_DEFAULTS:
            value, unit, why = CPU_DEFAULTS[name]
            if name == "peak_tflops":
                value, unit = value * cores / gpus_per_node, "TFLOP/s per process"
                why = f"{why} ({cores} cores here)"
        rates[name] = Rate(value, unit, why)
    if use_cache:
        rates.update(load_measurements(cache_files(), required=False))
    rates.update(load_measurements(measured, required=True))
    for name, value in (flags or {}).items():
        if value is not None:
            rates[name] = replace(rates[name], value=float(value), source="flag")
    return Machine(
        gpus_per_node=gpus_per_node,
        nodes=nodes,
        gpu_mem=0 if cpu_only else gpu_mem,
        cpu_mem=cpu_mem,
        nvme=nvme,
        cpu_only=cpu_only,
        rates=rates,
        host_overhead=(
            host_overhead
            if host_overhead is not None
            else HOST_OVERHEAD["cpu" if cpu_only else "gpu"]
        ),
        gpu_reserve=0 if cpu_only else (GPU_RESERVE if gpu_reserve is None else gpu_reserve),
    )


__all__ = ["Machine", "Rate", "build_machine", "load_measurements", "GB", "GIB"]

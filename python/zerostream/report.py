"""`zerostream report`: what this build and machine can do (like DeepSpeed's ds_report)."""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import sys
from typing import Optional

from . import _C, __version__


def _locked_memory_limit() -> str:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return "unlimited"
    return f"{soft // 1024} KiB"


def _torch_facts() -> dict:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:  # zerostream's native parts work without torch
        return {"torch": f"not importable ({exc})"}
    backends = []
    if dist.is_available():
        for name, probe in (
            ("gloo", dist.is_gloo_available),
            ("nccl", dist.is_nccl_available),
            ("mpi", dist.is_mpi_available),
            ("ucc", getattr(dist, "is_ucc_available", lambda: False)),
        ):
            if probe():
                backends.append(name)
    facts = {
        "torch": f"{torch.__version__} ({os.path.dirname(torch.__file__)})",
        "torch_cuda_build": torch.version.cuda or "none",
        "torch_cuda_available": torch.cuda.is_available(),
        "torch_gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "torch_distributed_backends": backends,
        "torch_threads": torch.get_num_threads(),
    }
    try:
        facts["torch_nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:  # no NCCL in this torch build
        facts["torch_nccl"] = f"unavailable ({type(exc).__name__})"
    return facts


def collect(path: Optional[str] = None) -> dict:
    build = _C.build_info()
    cpu = _C.cpu_info()
    cuda = _C.cuda_info()
    uring = _C.probe_io_uring()
    facts = {
        "zerostream": f"{__version__} ({os.path.dirname(__file__)})",
        "python": f"{platform.python_version()} ({sys.executable})",
        "compiler": build["compiler"],
        "simd_level": cpu["simd_level"],
        "cpu_flags": [
            k
            for k in (
                "avx512f",
                "avx512bw",
                "avx512vl",
                "avx512bf16",
                "avx2",
                "fma",
                "f16c",
                "neon",
            )
            if cpu[k]
        ],
        "openmp_threads": cpu["omp_max_threads"],
        "io_uring": "works" if not uring else f"unavailable: {uring} (thread-pool I/O is used)",
        "locked_memory_limit": _locked_memory_limit(),
        "cuda_build": bool(cuda["built"]),
        "cuda_runtime": cuda["runtime_version"],
        "cuda_driver": cuda["driver_version"],
        "gpus_visible": cuda["device_count"],
        "gpu_kernel_probe": "ok" if cuda["kernel_ok"] else (cuda["error"] or "no GPU"),
        "nccl_headers": cuda["nccl_version"],
    }
    shm = shutil.disk_usage("/dev/shm") if os.path.isdir("/dev/shm") else None
    facts["dev_shm_size"] = f"{shm.total // 2**20} MiB" if shm else "absent"
    if path is not None:
        if not os.path.isdir(path):
            facts["o_direct"] = f"{path}: no such directory"
        else:
            err = _C.probe_o_direct(path)
            facts["o_direct"] = (
                f"{path}: works"
                if not err
                else f"{path}: refused ({err}); buffered I/O will be used there"
            )
    facts.update(_torch_facts())
    return facts


def run(args) -> int:
    facts = collect(args.path)
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    width = max(len(k) for k in facts)
    print("zerostream report")
    print("-" * (width + 40))
    for key, value in facts.items():
        if isinstance(value, list):
            value = ", ".join(value) if value else "none"
        print(f"{key:<{width}}  {value}")
    return 0

"""`zerostream bench NAME`: each module here defines add_arguments(parser) and run(args) -> int."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Optional


def deepspeed_unavailable() -> Optional[str]:
    """Why DeepSpeed cannot be a peer here (not installed, or `deepspeed` is zerostream's
    compatibility package), or None. Read from the installed distribution's metadata without
    importing it: an import would leave `deepspeed` in sys.modules for the rest of the
    process, where code that must run without DeepSpeed then finds it."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed here"
    try:
        version = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return None  # a source checkout on the path: try it
    if "zerostream" in version:
        return f"`import deepspeed` is zerostream's compatibility package ({version})"
    return None


@contextlib.contextmanager
def stdout_to_stderr(enabled: bool = True):
    """Sends everything written to stdout (Python objects and fd 1: peers' loggers, JIT build
    output) to stderr inside the block, so `--json` leaves exactly one JSON object on stdout."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved_fd = os.dup(1)
    saved_obj = sys.stdout
    try:
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = saved_obj
        os.dup2(saved_fd, 1)
        os.close(saved_fd)


def remove_deepspeed_shm(addr: str, port: int) -> int:
    """Unlinks the shared-memory all-reduce segments DeepSpeed's CPU backend created for a job
    that rendezvoused at addr:port: /dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<r>,
    69 MB per rank. DeepSpeed 0.19 never unlinks them, so every peer run left them in RAM-backed
    /dev/shm (8.6 GB after a day of benchmarks and tests). Returns how many it removed."""
    prefix = f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_"
    removed = 0
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return 0
    for name in names:
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            try:
                os.unlink(os.path.join("/dev/shm", name))
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def cache_dir() -> str:
    """Where benchmarks leave their latest result for `zerostream estimate` to use as this
    machine's rates: $ZEROSTREAM_CACHE_DIR, else ~/.cache/zerostream."""
    return os.environ.get("ZEROSTREAM_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "zerostream"
    )


def remember(name: str, result: dict) -> Optional[str]:
    """Writes `result` as <cache_dir>/bench-<name>.json (whole or not at all: a temporary file
    renamed over it) and returns the path; a cache that cannot be written costs a note on
    stderr, never the benchmark."""
    root = cache_dir()
    path = os.path.join(root, f"bench-{name}.json")
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(root, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
        os.replace(tmp, path)
    except OSError as exc:
        print(
            f"bench {name}: could not save the result for zerostream estimate: {exc}",
            file=sys.stderr,
        )
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return None
    return path

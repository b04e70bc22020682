"""Runs a function on N ranks: processes on this machine talking Gloo on loopback, with a hard
timeout so a hang fails the test instead of blocking CI (see shared/TESTING.md).

Every run checks that the ranks issued the same collectives in the same order: each rank logs
the fingerprint of every collective it issues through zerostream.comm
(ZEROSTREAM_COLLECTIVE_LOG, Note [Ranks that issue different collectives] in
zerostream/comm/collective_check.py), and the run fails naming the first call where two ranks
differ, also when a rank aborted or hung there."""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import socket
import tempfile
import time
import traceback
from typing import Any, Callable, List


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, world, port, queue, args, env, parent_env):
    # The parent's environment as it is now (a forkserver child starts from the server's).
    os.environ.clear()
    os.environ.update(parent_env)
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_SIZE": str(world),
            **env,
        }
    )
    try:
        import torch

        torch.set_num_threads(1)  # N ranks share 2 cores
        result = fn(rank, world, *args)
        # Bytes, not tensors: tensors in a Queue travel as shared-memory handles that die
        # with this process before the parent reads them.
        buf = io.BytesIO()
        torch.save(result, buf)
        queue.put((rank, "ok", buf.getvalue()))
    except BaseException:  # report everything, including SystemExit from a rank
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass


def _context():
    """Ranks start from a fork server that imported torch once for the whole session (a
    spawned rank spent most of its start importing it: about 3 s of CPU per rank, 2 s of
    every multi-rank test on 2 cores). Nothing else is preloaded, so each rank imports
    zerostream and the test's module itself, under the environment _entry sets, as a spawned
    one does. The server's only other thread is OpenBLAS's pool (numpy, imported by torch),
    which re-initialises itself in a forked child (its own atfork handlers).
    ZS_TEST_START_METHOD=spawn goes back to spawning."""
    method = os.environ.get("ZS_TEST_START_METHOD", "forkserver")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch"])
    return ctx


def run_ranks(
    fn: Callable,
    world: int,
    *args: Any,
    timeout: float = 120.0,
    env: dict = None,
    expect_failure: bool = False,
    check_collectives: bool = True,
) -> List[Any]:
    """fn(rank, world, *args) on `world` processes; returns results ordered by rank.

    With expect_failure, returns [(status, payload)] per rank instead of raising, for tests
    where some rank is meant to die (the collectives are compared up to the shortest log).
    check_collectives=False leaves the collectives unchecked: only for tests that make ranks
    differ on purpose and check the outcome themselves.
    """
    log_dir = tempfile.mkdtemp(prefix="zs-collectives-") if check_collectives else None
    try:
        return _run(fn, world, args, timeout, env, expect_failure, log_dir)
    finally:
        if log_dir is not None:
            shutil.rmtree(log_dir, ignore_errors=True)


def collective_mismatch(log_dir: str, prefix_only: bool = False):
    """The first collective on which the ranks of a job that logged into `log_dir` differ,
    in words, or None. `prefix_only`: up to the shortest rank's log (a rank meant to die)."""
    from zerostream.comm.collective_check import first_difference, read_worlds

    worlds = read_worlds(log_dir)
    for key, logs in sorted(worlds.items()):
        if prefix_only and logs:
            shortest = min(len(v) for v in logs.values())
            logs = {r: v[:shortest] for r, v in logs.items()}
        found = first_difference(logs)
        if found:
            return f"{found} (the job at port.attempt {key})" if len(worlds) > 1 else found
    return None


def _run(fn, world, args, timeout, env, expect_failure, log_dir):
    ctx = _context()
    queue = ctx.Queue()
    port = free_port()
    parent = dict(os.environ)
    # Its own log directory; none when unchecked (not the one conftest gives the test).
    env = {**(env or {}), "ZEROSTREAM_COLLECTIVE_LOG": log_dir or ""}
    procs = [
        ctx.Process(
            target=_entry, args=(fn, r, world, port, queue, args, env or {}, parent), daemon=True
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results = {}
    start = time.monotonic()
    while len(results) < world:
        left = timeout - (time.monotonic() - start)
        if left <= 0:
            break
        try:
            rank, status, payload = queue.get(timeout=min(left, 1.0))
            results[rank] = (status, payload)
        except queue_mod.Empty:
            if all(not p.is_alive() for p in procs) and queue.empty():
                break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    differ = None
    if log_dir is not None:
        differ = collective_mismatch(log_dir, prefix_only=expect_failure)
    if expect_failure:
        if differ:
            raise AssertionError(f"the ranks issued different collectives: {differ}")
        return [
            results.get(r, ("missing", f"exit code {procs[r].exitcode}")) for r in range(world)
        ]  # "ok" payloads stay serialized bytes here
    first = f"the ranks issued different collectives: {differ}\n" if differ else ""
    missing = [r for r in range(world) if r not in results]
    if missing:
        raise AssertionError(
            f"{first}ranks {missing} did not finish within {timeout:.0f}s "
            f"(exit codes {[procs[r].exitcode for r in missing]})"
        )
    errors = [
        f"--- rank {r} ---\n{payload}"
        for r, (status, payload) in sorted(results.items())
        if status != "ok"
    ]
    if errors or differ:
        raise AssertionError(first + "\n".join(errors))
    import torch

    return [torch.load(io.BytesIO(results[r][1]), weights_only=False) for r in range(world)]

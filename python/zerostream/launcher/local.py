"""Starts this node's ranks with torch's elastic agent (`torch.distributed.launcher.api`, what
`torchrun` runs) and turns a failed run into a report with the rank that failed first.

Mapping onto elastic's LaunchConfig:
- nproc -> nproc_per_node; nnodes -> min_nodes = max_nodes (a fixed-size job);
- one node and no --master_port -> rendezvous "c10d" on localhost:0, torchrun's --standalone:
  the agent takes a free port, so two jobs on one machine never collide;
- otherwise rendezvous "static" at master_addr:master_port with rank = node_rank (torchrun's
  --master_addr/--master_port/--node_rank), run id "zerostream" on every node;
- max_restarts (--max_restarts, 0 by default): after a rank fails, elastic stops the others
  and starts this node's ranks again, up to that many times (TORCHELASTIC_RESTART_COUNT
  tells a rank which attempt it is); past it, or at 0, the failure ends the job;
- each rank runs `python -u _child.py ... -- TARGET [--local_rank=${local_rank}] ARGS`;
  elastic substitutes ${local_rank} and sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
  GROUP_RANK, MASTER_ADDR, MASTER_PORT and TORCHELASTIC_ERROR_FILE; _child.py adds
  DeepSpeed's names, the core binding and the error file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import uuid
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from . import failures

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child.py")
DEFAULT_MASTER_PORT = 29500  # DeepSpeed's and torchrun's


@dataclass(frozen=True)
class Program:
    """What each rank runs: a Python file (`script`), a module (`module`, --module) or any
    program (`exec`, --no_python), and whether `--local_rank=N` goes before its arguments."""

    target: str
    args: Tuple[str, ...]
    kind: str
    local_rank_arg: bool

    def launcher_flags(self) -> List[str]:
        """The flags that make another node's `zerostream.launcher` run this program alike."""
        out = [] if self.local_rank_arg else ["--no_local_rank"]
        return out + {"script": [], "module": ["--module"], "exec": ["--no_python"]}[self.kind]


@dataclass(frozen=True)
class NodeRun:
    """This node's share of the job."""

    nnodes: int
    node_rank: int
    nproc: int
    master_addr: str
    master_port: Optional[int]  # None on one node: a free port (see the module docstring)
    core_sets: Optional[List[List[int]]] = None  # --bind_cores_to_rank, one set per rank
    env: Optional[Dict[str, str]] = None  # extra environment for the ranks (device mask)
    rank_log_dir: Optional[str] = None  # --enable_each_rank_log
    max_restarts: int = 0  # --max_restarts


def rank_command(program: Program, core_sets: Optional[Sequence[Sequence[int]]]):
    """(entrypoint, args) for elastic: the same for every local rank but ${local_rank}."""
    from torch.distributed.elastic.utils.api import macros

    python = os.environ.get("PYTHON_EXEC", sys.executable)
    args: List[str] = ["-u", CHILD]
    if core_sets:
        args += ["--cores", ";".join(",".join(str(c) for c in s) for s in core_sets)]
    args += ["--run", program.kind, "--", program.target]
    if program.local_rank_arg:
        args.append(f"--local_rank={macros.local_rank}")
    # Elastic runs string.Template over every argument: "$$" would reach the program as "$"
    # and "${local_rank}" as a number. Doubling "$" hands the user's arguments over verbatim.
    args += [a.replace("$", "$$") for a in program.args]
    return python, args


def _launch_config(node: NodeRun, logs_specs):
    from torch.distributed.launcher.api import LaunchConfig

    if node.nnodes == 1 and node.master_port is None:
        backend, endpoint, run_id, rdzv_configs = "c10d", "localhost:0", str(uuid.uuid4()), {}
    else:
        port = node.master_port or DEFAULT_MASTER_PORT
        backend, endpoint = "static", f"{node.master_addr}:{port}"
        run_id, rdzv_configs = "zerostream", {"rank": node.node_rank}
    return LaunchConfig(
        min_nodes=node.nnodes,
        max_nodes=node.nnodes,
        nproc_per_node=node.nproc,
        logs_specs=logs_specs,
        run_id=run_id,
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_configs=rdzv_configs,
        max_restarts=node.max_restarts,
        start_method="spawn",
    )


@contextlib.contextmanager
def _quiet_process_log() -> Iterator[None]:
    """Elastic logs each failed and each stopped rank (pid, binary) as it tears the job down;
    the report printed here says the same with the error, so its lines are held back."""
    log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


# Note [The store's host leaves first]
# Elastic's agents meet at an exit barrier in the job's store once their ranks are done. The
# store lives in node 0's agent (static rendezvous), which leaves as soon as it has seen every
# agent arrive; an agent that arrived last may still be waiting for the barrier's key when
# the store goes away, and elastic logs that as "Error waiting on exit barrier" with a
# DistNetworkError traceback although every rank of the job finished (issue 32 item 1: it
# looked like a failure on one run in two). This node's own ranks have succeeded by then
# (elastic calls the barrier only after that), and a failure on another node is reported
# there, by that node's agent; so the record is dropped when the store connection is what
# failed. Any other error in the barrier (a timeout: an agent never arrived) is logged.
class _StoreLeftFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("Error waiting on exit barrier"):
            return True
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, _dist_network_error())


@contextlib.contextmanager
def _store_host_may_leave_first() -> Iterator[None]:
    log = logging.getLogger("torch.distributed.elastic.agent.server.api")
    quiet = _StoreLeftFilter()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)


@contextlib.contextmanager
def _environment(extra: Optional[Dict[str, str]]) -> Iterator[None]:
    """Elastic's ranks inherit this process's environment when they start."""
    saved = {k: os.environ.get(k) for k in (extra or {})}
    os.environ.update(extra or {})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def launch(node: NodeRun, program: Program) -> int:
    """Runs this node's ranks to the end; the exit status for `zerostream run`."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.launcher.api import elastic_launch

    entrypoint, args = rank_command(program, node.core_sets)
    with contextlib.ExitStack() as stack:
        if node.rank_log_dir:
            os.makedirs(node.rank_log_dir, exist_ok=True)
            logs = DefaultLogsSpecs(log_dir=node.rank_log_dir, redirects=Std.ALL)
        else:  # error files only, removed with the run
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="zerostream_run_"))
            logs = DefaultLogsSpecs(log_dir=tmp)
        config = _launch_config(node, logs)
        # Each rank checks that this process is its parent (_child.py, Note [Ranks die with
        # their agent]): elastic's agent runs here and starts the ranks itself.
        stack.enter_context(_environment({**(node.env or {}), "ZS_AGENT_PID": str(os.getpid())}))
        stack.enter_context(_quiet_process_log())
        stack.enter_context(_store_host_may_leave_first())
        try:
            elastic_launch(config, entrypoint)(*args)
        except ChildFailedError as err:
            found = failures.failures_in_order(err)
            print(failures.report(found), file=sys.stderr, flush=True)
            return found[0].exit_status
        except SignalException as exc:
            print(
                f"zerostream run: stopped by {exc.sigval.name}; this node's ranks were stopped",
                file=sys.stderr,
            )
            return 128 + int(exc.sigval)
        except (RendezvousError, _dist_error()) as exc:
            print(
                f"zerostream run: node {node.node_rank} of {node.nnodes} could not join the "
                f"job at {config.rdzv_endpoint} ({config.rdzv_backend} rendezvous): {exc}",
                file=sys.stderr,
            )
            return 1
    return 0


def _dist_error():
    import torch.distributed as dist

    return dist.DistError


def _dist_network_error():
    import torch.distributed as dist

    return dist.DistNetworkError

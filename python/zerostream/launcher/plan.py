"""From `zerostream run`'s flags to what runs: this node's share of the job (a NodeRun and the
Program each rank runs), or, for a hostfile with several hosts, one command line per node.

Which hosts and slots (DeepSpeed's rules, see resources.py):
- no hostfile: this machine, one slot per visible GPU, or 2 without one; --num_gpus sets the
  count, --include/--exclude pick among the slots of `localhost`;
- a hostfile (-H, or DeepSpeed's /job/hostfile when it exists and neither -H nor --node_rank
  is given): its hosts, filtered by --include/--exclude, then --num_nodes/--num_gpus;
- a hostfile naming only this machine runs here; with several hosts --node_rank i (or
  DeepSpeed's --no_ssh with it) runs node i's share here, else each node's line is printed
  (and run over ssh with --launcher ssh), or one cluster launcher's command is made
  (--launcher pdsh, openmpi, mpich, impi, slurm, mvapich: cluster.py);
- --world_info (what pdsh's node command carries) with --node_rank i: node i's share of the
  hosts and slots it lists.
Without a hostfile, --num_nodes N > 1 with --node_rank and --master_addr runs this node's
share of an N-node job, as the printed lines do.
"""

from __future__ import annotations

import collections
import os
import shutil
import socket
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from . import cluster, cores, nodes, resources
from .local import DEFAULT_MASTER_PORT, NodeRun, Program

DLTS_HOSTFILE = "/job/hostfile"  # DeepSpeed's default --hostfile
# local: print each node's command; ssh: run them (nodes.py); the rest: cluster.py.
LAUNCHERS = ("local", "ssh", *cluster.LAUNCHERS)
NO_GPU_SLOTS = 2


@dataclass(frozen=True)
class MultiNode:
    """A job over several hosts: the nodes and each one's shell line, in node-rank order."""

    nodes: List[resources.Node]
    master_addr: str
    master_port: int
    lines: List[str]


def check_flags(args) -> None:
    """Combinations DeepSpeed refuses, and values no run can have; ValueError naming them."""
    if args.include and args.exclude:
        raise ValueError("--include and --exclude are mutually exclusive; give one of them")
    counts = [f for f, v in (("--num_nodes", args.num_nodes), ("--num_gpus", args.num_gpus)) if v]
    if (args.include or args.exclude) and counts:
        which = "--include" if args.include else "--exclude"
        raise ValueError(
            f"{which} cannot be combined with {' and '.join(counts)}: the filter already says "
            f"which hosts and slots run (DeepSpeed refuses this too)"
        )
    for flag, value in (("--num_nodes", args.num_nodes), ("--num_gpus", args.num_gpus)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} {value}: expected a positive count")
    if args.node_rank is not None and args.node_rank < 0:
        raise ValueError(f"--node_rank {args.node_rank}: expected 0 or more")
    if args.master_port is not None and not 0 < args.master_port < 65536:
        raise ValueError(f"--master_port {args.master_port}: expected a TCP port (1-65535)")
    if args.module and args.no_python:
        raise ValueError("--module and --no_python cannot be used together")
    if args.no_ssh and args.node_rank is None:
        raise ValueError("--no_ssh runs one node's share: give its --node_rank")
    if args.launcher not in LAUNCHERS:
        raise ValueError(f"--launcher {args.launcher}: expected one of {', '.join(LAUNCHERS)}")
    if args.launcher != "local" and (args.node_rank is not None or args.no_ssh):
        raise ValueError(
            f"--launcher {args.launcher} starts every node from here; --node_rank/--no_ssh run "
            f"one node's share on the node itself: give one or the other"
        )
    if args.world_info is not None and args.node_rank is None:
        raise ValueError("--world_info lists the job's nodes: give this node's --node_rank")
    given = [
        f for f in ("hostfile", "include", "exclude", "num_nodes", "num_gpus") if getattr(args, f)
    ]
    if args.world_info is not None and given:
        raise ValueError(
            f"--world_info already says which hosts and slots run; drop "
            f"{', '.join('--' + f for f in given)}"
        )
    if args.max_restarts < 0:
        raise ValueError(f"--max_restarts {args.max_restarts}: expected 0 or more")
    elastic = [
        f
        for f, on in (
            ("--elastic_training", args.elastic_training),
            ("--min_elastic_nodes", args.min_elastic_nodes != -1),
            ("--max_elastic_nodes", args.max_elastic_nodes != -1),
        )
        if on
    ]
    if elastic:
        raise NotImplementedError(
            f"{', '.join(elastic)}: a job whose node count changes while it runs is not "
            "supported by zerostream run; jobs keep their size, and --max_restarts N restarts "
            "the ranks after a failure (the script resumes from its newest checkpoint, which "
            "loads into another world size too)"
        )
    if args.bind_core_list and not args.bind_cores_to_rank:
        raise ValueError("--bind_core_list needs --bind_cores_to_rank")


def program_of(args) -> Program:
    kind = "module" if args.module else "exec" if args.no_python else "script"
    return Program(args.user_script, tuple(args.user_args), kind, not args.no_local_rank)


def _check_program_here(program: Program) -> None:
    if program.kind == "script" and not os.path.isfile(program.target):
        raise ValueError(
            f"user script {program.target!r}: no such file (from {os.getcwd()}); "
            f"use --module for a module or --no_python for a program"
        )
    if program.kind == "exec" and shutil.which(program.target) is None:
        raise ValueError(f"--no_python {program.target!r}: no such program or not executable")


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def this_machine() -> "collections.OrderedDict[str, resources.Host]":
    gpus = _gpu_count()
    if gpus:
        host = resources.Host("localhost", gpus, f"this machine ({gpus} visible GPUs)")
    else:
        host = resources.Host("localhost", NO_GPU_SLOTS, "this machine (no GPU: 2 processes)")
    return collections.OrderedDict(localhost=host)


def _local_names() -> set:
    name = socket.gethostname()
    return {"localhost", "127.0.0.1", "::1", name, name.split(".")[0]}


def _device_env(slots: Tuple[int, ...]) -> Optional[Dict[str, str]]:
    """CUDA_VISIBLE_DEVICES for the chosen slots of this machine's GPUs, in terms of the
    devices already visible; None when they are simply the first N."""
    gpus = _gpu_count()
    if not gpus or slots == tuple(range(len(slots))):
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")] if visible else [str(i) for i in range(gpus)]
    return {"CUDA_VISIBLE_DEVICES": ",".join(ids[s] for s in slots)}


def _core_sets(args, nproc: int) -> Optional[List[List[int]]]:
    if not args.bind_cores_to_rank:
        return None
    return cores.split_cores(cores.core_pool(args.bind_core_list), nproc)


def _hostfile(args) -> Optional[str]:
    if args.hostfile:
        if not os.path.isfile(args.hostfile):
            raise ValueError(f"--hostfile {args.hostfile}: no such file")
        return args.hostfile
    if args.hostfile is None and args.node_rank is None and os.path.isfile(DLTS_HOSTFILE):
        return DLTS_HOSTFILE
    return None


def _node_run(args, nnodes, node_rank, slots, master_addr, master_port) -> NodeRun:
    return NodeRun(
        nnodes=nnodes,
        node_rank=node_rank,
        nproc=len(slots),
        master_addr=master_addr,
        master_port=master_port,
        core_sets=_core_sets(args, len(slots)),
        env=_device_env(slots),
        rank_log_dir=args.enable_each_rank_log,
        max_restarts=args.max_restarts,
    )


def _without_hostfile(args, program: Program) -> NodeRun:
    if args.num_gpus:  # as DeepSpeed: that many ranks, whatever this machine has
        slots = tuple(range(args.num_gpus))
    else:
        slots = resources.select_nodes(this_machine(), args.include, args.exclude)[0].slots
    nnodes = args.num_nodes or 1
    node_rank = args.node_rank or 0
    if nnodes > 1 and (args.node_rank is None or not args.master_addr):
        raise ValueError(
            f"--num_nodes {nnodes} without --hostfile: give this node's --node_rank and the "
            f"first node's --master_addr and run the command on every node, or list the nodes "
            f"in a hostfile"
        )
    if node_rank >= nnodes:
        raise ValueError(f"--node_rank {node_rank}: the job has {nnodes} node(s) (--num_nodes)")
    _check_program_here(program)
    port = args.master_port if nnodes == 1 else (args.master_port or DEFAULT_MASTER_PORT)
    return _node_run(args, nnodes, node_rank, slots, args.master_addr or "127.0.0.1", port)


def plan(args) -> Union[Tuple[NodeRun, Program], MultiNode, cluster.ClusterCommand]:
    """This node's share of the job; or, for several hosts started from here, each node's
    command line (--launcher local, ssh) or the cluster launcher's command."""
    check_flags(args)
    program = program_of(args)
    if args.world_info is not None:
        chosen = resources.decode_world_info(args.world_info)
        return _one_node(args, chosen, "--world_info", program), program
    path = _hostfile(args)
    if path is None:
        return _without_hostfile(args, program), program
    chosen = resources.select_nodes(
        resources.parse_hostfile(path), args.include, args.exclude, args.num_nodes, args.num_gpus
    )
    if len(chosen) == 1 and chosen[0].name in _local_names() and not args.node_rank:
        _check_program_here(program)
        return _node_run(args, 1, 0, chosen[0].slots, "127.0.0.1", args.master_port), program
    if args.node_rank is not None:
        return _one_node(args, chosen, path, program), program
    master_addr = args.master_addr or chosen[0].name
    master_port = args.master_port or DEFAULT_MASTER_PORT
    cwd = os.getcwd()
    exported = nodes.exported_env(dict(os.environ), cwd)
    if args.launcher in cluster.LAUNCHERS:
        job = cluster_job(args, chosen, master_addr, master_port, exported, cwd)
        return cluster.command(args.launcher, job)
    lines = [
        nodes.shell_line(
            cwd,
            nodes.node_env(node, exported),
            nodes.node_argv(
                i, chosen, master_addr, master_port, forwarded_flags(args), program_argv(args)
            ),
        )
        for i, node in enumerate(chosen)
    ]
    return MultiNode(chosen, master_addr, master_port, lines)


def _one_node(args, chosen: List[resources.Node], source: str, program: Program) -> NodeRun:
    """Node --node_rank's share of a job over `chosen` (from a hostfile or --world_info)."""
    if args.node_rank >= len(chosen):
        raise ValueError(
            f"--node_rank {args.node_rank}: {source} gives {len(chosen)} node(s) "
            f"({', '.join(n.name for n in chosen)})"
        )
    _check_program_here(program)
    master_addr = args.master_addr or chosen[0].name
    master_port = args.master_port or DEFAULT_MASTER_PORT
    slots = chosen[args.node_rank].slots
    return _node_run(args, len(chosen), args.node_rank, slots, master_addr, master_port)


def cluster_job(
    args,
    chosen: Sequence[resources.Node],
    master_addr: str,
    master_port: int,
    exports: Dict[str, str],
    cwd: str,
) -> cluster.ClusterJob:
    """The job a cluster launcher starts, from the launcher flags (also DeepSpeed's own
    namespace, whose --venv_script and --slurm_comment zerostream run does not have)."""
    return cluster.ClusterJob(
        nodes=tuple(chosen),
        master_addr=master_addr,
        master_port=master_port,
        program=program_of(args),
        exports=exports,
        launcher_args=args.launcher_args,
        cwd=cwd,
        python=nodes.python_exec(),
        bind_cores_to_rank=args.bind_cores_to_rank,
        bind_core_list=args.bind_core_list,
        rank_log_dir=args.enable_each_rank_log,
        max_restarts=getattr(args, "max_restarts", 0),
        ssh_port=args.ssh_port,
        venv_script=getattr(args, "venv_script", None),
        slurm_comment=getattr(args, "slurm_comment", "") or "",
        cuda=_gpu_count() > 0,
    )


def agent_flags(args) -> List[str]:
    """The flags about how a node's agent runs its ranks, which every node keeps."""
    return nodes.agent_flags(
        args.bind_cores_to_rank, args.bind_core_list, args.enable_each_rank_log, args.max_restarts
    )


def forwarded_flags(args) -> List[str]:
    """The flags a node's own `zerostream.launcher` keeps from this command line."""
    return agent_flags(args) + program_of(args).launcher_flags()


def program_argv(args) -> List[str]:
    return [args.user_script, *args.user_args]

"""`zerostream run [launcher flags] user_script.py [user args]`: the flags (DeepSpeed's
launcher's names, torchrun's where DeepSpeed has none) and what the command does with them."""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys

from . import cluster, local, nodes, plan

DESCRIPTION = (
    "Start a training script on this machine's GPUs (or 2 processes without one) or on the "
    "hosts of a hostfile, through torch's elastic agent. Every rank gets RANK, LOCAL_RANK, "
    "WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and --local_rank=N before the "
    "script's own arguments (as DeepSpeed's launcher). Flags after the script go to the script."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("where the ranks run")
    where.add_argument(
        "-H",
        "--hostfile",
        default=None,
        help="'HOST slots=N' per line, # comments (DeepSpeed's format). Default: /job/hostfile "
        "if it exists, else this machine only",
    )
    where.add_argument(
        "-i",
        "--include",
        default="",
        help="hosts and slots to use, NODE[:SLOT,SLOT...][@NODE...] (e.g. worker-0:0,2@worker-1;"
        " without a hostfile the node is localhost)",
    )
    where.add_argument(
        "-e",
        "--exclude",
        default="",
        help="hosts and slots to leave out, same format as --include",
    )
    where.add_argument(
        "--num_nodes",
        type=int,
        default=None,
        help="use the first N hosts of the hostfile; without one, the node count of a job "
        "started on each node with --node_rank",
    )
    where.add_argument(
        "--num_gpus",
        "--num_accelerators",
        "--nproc",
        "--nproc_per_node",
        dest="num_gpus",
        type=int,
        default=None,
        help="processes per node (slots 0..N-1). Default: one per visible GPU, or 2 without one",
    )
    where.add_argument(
        "--node_rank",
        type=int,
        default=None,
        help="run only this node's share (a multi-node job started on each node)",
    )
    where.add_argument(
        "--no_ssh",
        action="store_true",
        help="DeepSpeed's name for running one node's share here; needs --node_rank",
    )
    where.add_argument(
        "--master_addr",
        default="",
        help="address of node 0. Default: 127.0.0.1 on one machine, else the first host",
    )
    where.add_argument(
        "--master_port",
        type=int,
        default=None,
        help=f"port on node 0 (default {local.DEFAULT_MASTER_PORT} across nodes; a job on one "
        f"machine without it takes a free port, so two jobs never collide)",
    )
    where.add_argument(
        "--launcher",
        default="local",
        type=str.lower,
        metavar="{" + ",".join(plan.LAUNCHERS) + "}",
        help="with several hosts: 'local' prints each node's command, 'ssh' runs them "
        "over ssh; pdsh, openmpi, mpich, impi, slurm or mvapich start the job through that "
        "program (default: local)",
    )
    where.add_argument("--ssh_port", type=int, default=None, help="port for --launcher ssh or pdsh")
    where.add_argument(
        "--launcher_args",
        default="",
        help="extra options for the launcher program (ssh, pdsh, mpirun, srun), one string",
    )
    where.add_argument(
        "--world_info",
        default=None,
        help="the job's hosts and slots, base64 JSON {host: [slots]} (DeepSpeed's format, "
        "what --launcher pdsh gives each node); with --node_rank runs that node's share",
    )

    how = parser.add_argument_group("how each rank runs")
    how.add_argument(
        "--bind_cores_to_rank",
        action="store_true",
        help="split this node's cores among its ranks (disjoint sets; OMP_NUM_THREADS = cores "
        "per rank)",
    )
    how.add_argument(
        "--bind_core_list",
        default=None,
        help="the cores --bind_cores_to_rank splits, e.g. 0-7,16-23 (default: all this process "
        "may use)",
    )
    how.add_argument(
        "--no_local_rank",
        action="store_true",
        help="do not add --local_rank=N to the script's arguments",
    )
    how.add_argument(
        "--module", action="store_true", help="the script is a module name, run as python -m"
    )
    how.add_argument(
        "--no_python",
        action="store_true",
        help="the script is a program, run without python",
    )
    how.add_argument(
        "--max_restarts",
        type=int,
        default=0,
        help="restart this node's ranks up to N times after one fails (torchrun's flag); the "
        "script resumes from its newest checkpoint (README: several machines)",
    )
    how.add_argument(
        "--elastic_training",
        action="store_true",
        help="DeepSpeed's elastic training (nodes joining, leaving): refused; see --max_restarts",
    )
    how.add_argument("--min_elastic_nodes", type=int, default=-1, help=argparse.SUPPRESS)
    how.add_argument("--max_elastic_nodes", type=int, default=-1, help=argparse.SUPPRESS)
    how.add_argument(
        "--enable_each_rank_log",
        default=None,
        metavar="DIR",
        help="write each rank's stdout and stderr to files under DIR instead of the console",
    )
    parser.add_argument("user_script", help="the training script (or module, or program)")
    parser.add_argument("user_args", nargs=argparse.REMAINDER, help="its arguments")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Adds the `run` subcommand to `zerostream`'s subparsers."""
    parser = subparsers.add_parser(
        "run",
        help="launch a training script on several processes or nodes",
        description=DESCRIPTION,
        allow_abbrev=False,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """The exit status: 0, the first failed rank's (or node's) code, 2 for bad flags."""
    try:
        return execute(args)
    except (ValueError, NotImplementedError) as exc:
        print(f"zerostream run: {exc}", file=sys.stderr)
        return 2


def execute(args: argparse.Namespace) -> int:
    """As `run`, but bad flags raise (ValueError, NotImplementedError) before anything
    starts, as DeepSpeed's `runner.main` does."""
    what = plan.plan(args)
    if isinstance(what, plan.MultiNode):
        return _multi_node(args, what)
    if isinstance(what, cluster.ClusterCommand):
        return _cluster(what)
    node, program = what
    return local.launch(node, program)


def _cluster(cmd: cluster.ClusterCommand) -> int:
    if shutil.which(cmd.argv[0]) is None:  # checked before anything is printed or started
        raise ValueError(
            f"--launcher {cmd.launcher}: no `{cmd.argv[0]}` on PATH; install it, or use "
            f"--launcher ssh (or local, which prints each node's command)"
        )
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in cmd.env.items())
    print(f"zerostream run: {(assigns + ' ') if assigns else ''}{shlex.join(cmd.argv)}", flush=True)
    return cluster.run(cmd)


def _multi_node(args, job: plan.MultiNode) -> int:
    hosts = [n.name for n in job.nodes]
    ssh = None
    if args.launcher == "ssh":  # checked before anything is printed or started
        ssh = [
            nodes.ssh_argv(h, line, args.ssh_port, args.launcher_args)
            for h, line in zip(hosts, job.lines)
        ]
    print(
        f"zerostream run: {len(hosts)} node(s) ({', '.join(hosts)}), master "
        f"{job.master_addr}:{job.master_port}; the command of each node:",
        flush=True,
    )
    for rank, line in enumerate(job.lines):
        print(f"[node {rank}: {hosts[rank]}] {line}", flush=True)
    if ssh is None:
        print(
            "zerostream run: run each line on its node, or add --launcher ssh to start them "
            "from here",
            flush=True,
        )
        return 0
    return nodes.run_over_ssh(hosts, ssh)


def main(argv=None) -> int:
    """Entry for `python -m zerostream.launcher` (each node's command line) and for a console
    script such as the `deepspeed` command of the compatibility package: the same flags."""
    parser = argparse.ArgumentParser(
        prog="zerostream run", description=DESCRIPTION, allow_abbrev=False
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))

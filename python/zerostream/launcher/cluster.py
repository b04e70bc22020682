"""A job started through a cluster's own launcher: pdsh, Open MPI, MPICH, Intel MPI, MVAPICH2
or SLURM's srun (`zerostream run --launcher NAME`; DeepSpeed's multi-node runners).

A rank comes to life in one of two ways:

- pdsh runs zerostream's agent on every node at once over ssh, with one command line for
  all of them: `python -u -m zerostream.launcher --world_info=W --node_rank=%n ...`. pdsh
  replaces %n by the node's index in its host list and the world info (Note [World info] in
  resources.py) gives that node's slots, so each agent starts its node's ranks as
  `zerostream run --node_rank` does: core binding, restarts and per-rank logs included.
- the MPIs and srun start every rank themselves, as the user's program. A rank learns
  RANK, WORLD_SIZE and LOCAL_RANK from the launcher's variables (zerostream.comm reads Open
  MPI's OMPI_COMM_WORLD_*, the PMI_RANK/PMI_SIZE/MPI_LOCALRANKID of MPICH's Hydra, which
  Intel MPI and MVAPICH2 also use, and SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID), and
  MASTER_ADDR/MASTER_PORT are exported, since no launcher says where rank 0 listens. One
  command serves every rank, so no `--local_rank=N` is added (DeepSpeed adds none either).
  The local rank picks the device, so each node must use its first N slots; the Hydra MPIs
  and srun also put the same number of ranks on every node (-ppn, --ntasks-per-node).
  Restarts and per-rank log files are the agent's, which does not run here: refused, as is
  --bind_cores_to_rank except with Intel MPI (numactl in front of each rank, numa.py).

The builders are pure: each returns the argv, the variables for the launcher program's own
environment, and for pdsh the command that stops the nodes' agents. `run` executes one.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from . import cores, nodes, numa
from .local import Program
from .resources import Node, encode_world_info

PDSH, OPENMPI, MPICH, IMPI, SLURM, MVAPICH = "pdsh", "openmpi", "mpich", "impi", "slurm", "mvapich"
LAUNCHERS = (PDSH, OPENMPI, MPICH, IMPI, SLURM, MVAPICH)
# The program each one runs (all the MPIs name theirs mpirun).
PROGRAMS = {launcher: "mpirun" for launcher in (OPENMPI, MPICH, IMPI, MVAPICH)}
PROGRAMS.update({PDSH: "pdsh", SLURM: "srun"})
# pdsh -f: how many ssh connections run at once; DeepSpeed's value, above any job's node count.
PDSH_FAN_OUT = 1024
# Open MPI's TCP transport is limited to eth0 unless --launcher_args names
# btl_tcp_if_include: DeepSpeed's default, kept so a job moved from it behaves alike.
OPENMPI_TCP_INTERFACE = "eth0"
# MVAPICH2 settings every job gets (DeepSpeed's): no CMA (absent from Ubuntu's kernels),
# backtraces on failure, the deep-learning support mode, no MVAPICH core pinning (the CPU
# kernels size their threads from the affinity mask), allgather tuning.
MVAPICH_ENV = (
    ("MV2_SMP_USE_CMA", "0"),
    ("MV2_DEBUG_SHOW_BACKTRACE", "1"),
    ("MV2_SUPPORT_DL", "1"),
    ("MV2_ENABLE_AFFINITY", "0"),
    ("MV2_INTER_ALLGATHER_TUNING", "5"),
    ("MV2_CUDA_USE_NAIVE", "0"),
)


@dataclass(frozen=True)
class ClusterJob:
    """What the command line of any cluster launcher says about a job."""

    nodes: Tuple[Node, ...]
    master_addr: str
    master_port: int
    program: Program
    exports: Mapping[str, str] = field(default_factory=dict)  # set for every rank
    launcher_args: str = ""  # --launcher_args, split as a shell would
    cwd: str = "."  # pdsh: where each node's agent starts
    python: str = sys.executable
    bind_cores_to_rank: bool = False
    bind_core_list: Optional[str] = None
    numa_nodes: Optional[Mapping[int, Sequence[int]]] = None  # None: this machine's (numa.py)
    rank_log_dir: Optional[str] = None  # --enable_each_rank_log
    max_restarts: int = 0
    ssh_port: Optional[int] = None  # pdsh
    venv_script: Optional[str] = None  # pdsh: sourced on each node first
    slurm_comment: str = ""
    cuda: bool = False  # MVAPICH2: CUDA-aware transfers


@dataclass(frozen=True)
class ClusterCommand:
    """A launcher's command line and what running it needs."""

    launcher: str
    argv: Tuple[str, ...]
    env: Mapping[str, str]  # for the launcher program itself, over this process's environment
    stop_argv: Optional[Tuple[str, ...]] = None  # pdsh: ends every node's agent


def command(
    launcher: str, job: ClusterJob, environ: Optional[Mapping[str, str]] = None
) -> ClusterCommand:
    """The command that starts `job` through `launcher` (one of LAUNCHERS)."""
    if launcher not in _BUILDERS:
        raise ValueError(f"--launcher {launcher}: expected one of {', '.join(LAUNCHERS)}")
    if not job.nodes:
        raise ValueError(f"--launcher {launcher}: the job has no node")
    return _BUILDERS[launcher](job, os.environ if environ is None else environ)


def _pdsh(job: ClusterJob, environ: Mapping[str, str]) -> ClusterCommand:
    world = encode_world_info({n.name: n.slots for n in job.nodes})
    where = [f"--master_addr={job.master_addr}", f"--master_port={job.master_port}"]
    agent = [job.python, "-u", "-m", "zerostream.launcher", f"--world_info={world}"]
    agent += ["--node_rank=%n", *where]
    agent += nodes.agent_flags(
        job.bind_cores_to_rank, job.bind_core_list, job.rank_log_dir, job.max_restarts
    )
    agent += [*job.program.launcher_flags(), job.program.target, *job.program.args]
    line = nodes.shell_line(job.cwd, dict(job.exports), agent)
    if job.venv_script:
        line = f". {shlex.quote(job.venv_script)} && {line}"
    hosts = ",".join(n.name for n in job.nodes)
    pdsh = ["pdsh", "-S", "-f", str(PDSH_FAN_OUT), "-w", hosts, *shlex.split(job.launcher_args)]
    env = {"PDSH_RCMD_TYPE": "ssh"}
    if job.ssh_port is not None:
        before = environ.get("PDSH_SSH_ARGS_APPEND", "")
        env["PDSH_SSH_ARGS_APPEND"] = f"{before} -p {job.ssh_port}".strip()
    # "[.]" matches the agents' command lines but not the pattern's own text, so the remote
    # shell running pkill survives it.
    pattern = f"zerostream[.]launcher --world_info={world} --node_rank=[0-9]+ " + " ".join(
        w.replace(".", "[.]") for w in where
    )
    stop = (*pdsh, f"pkill -f -- {shlex.quote(pattern)}")
    return ClusterCommand(PDSH, (*pdsh, line), env, stop)


def _openmpi(job: ClusterJob, environ: Mapping[str, str]) -> ClusterCommand:
    _check_ranks(OPENMPI, job, same_count=False)
    extra = shlex.split(job.launcher_args)
    hosts = ",".join(f"{n.name}:{len(n.slots)}" for n in job.nodes)
    # ^openib: not the InfiniBand transport Open MPI deprecated for UCX (DeepSpeed's flag).
    argv = ["mpirun", "-n", str(_total(job)), "-H", hosts, "--mca", "btl", "^openib"]
    given = any(
        a in ("-mca", "--mca") and b == "btl_tcp_if_include" for a, b in zip(extra, extra[1:])
    )
    if not given:
        argv += ["--mca", "btl_tcp_if_include", OPENMPI_TCP_INTERFACE]
    argv += extra
    for key, value in _rank_env(job, {"UCX_TLS": "tcp"}).items():
        argv += ["-x", f"{key}={value}"]
    return ClusterCommand(OPENMPI, tuple(argv + _rank_argv(job)), {})


def _mpich(job: ClusterJob, environ: Mapping[str, str]) -> ClusterCommand:
    ppn = _check_ranks(MPICH, job, same_count=True)
    argv = ["mpirun", "-n", str(_total(job)), "-ppn", str(ppn), "-hosts", _hosts(job)]
    argv += shlex.split(job.launcher_args) + _genv(_rank_env(job, {}, hydra=True))
    return ClusterCommand(MPICH, tuple(argv + _rank_argv(job)), {})


def _impi(job: ClusterJob, environ: Mapping[str, str]) -> ClusterCommand:
    ppn = _check_ranks(IMPI, job, same_count=True)
    bindings = None
    # Intel MPI's own pinning would confine each rank to a core or two, and the CPU kernels
    # size their threads from the affinity mask: off, numactl (or nothing) decides.
    extra_env = {"I_MPI_PIN": "0"}
    if job.bind_cores_to_rank:
        pool = cores.core_pool(job.bind_core_list)
        bindings = [numa.rank_binding(pool, ppn, r, job.numa_nodes, environ) for r in range(ppn)]
        extra_env["OMP_NUM_THREADS"] = str(bindings[0][0])
    argv = ["mpirun", "-ppn", str(ppn), "-hosts", _hosts(job), *shlex.split(job.launcher_args)]
    argv += _genv({**_rank_env(job, {}, hydra=True), **extra_env})
    if bindings is None:
        return ClusterCommand(IMPI, tuple(argv + ["-n", str(_total(job))] + _rank_argv(job)), {})
    for rank in range(_total(job)):  # one MPMD segment per rank, each with its own cores
        local = rank % ppn
        argv += [":"] if rank else []
        argv += ["-n", "1", "-env", "RANK", str(rank), "-env", "LOCAL_RANK", str(local)]
        argv += bindings[local][1] + _rank_argv(job)
    return ClusterCommand(IMPI, tuple(argv), {})


def _mvapich(job: ClusterJob, environ: Mapping[str, str]) -> ClusterCommand:
    ppn = _check_ranks(MVAPICH, job, same_count=True)
    defaults = dict(MVAPICH_ENV, **({"MV2_USE_CUDA": "1"} if job.cuda else {}))
    argv = ["mpirun", "-np", str(_total(job)), "-ppn", str(ppn), "-hosts", _hosts(job)]
    argv += shlex.split(job.launcher_args) + _genv(_rank_env(job, defaults, hydra=True))
    return ClusterCommand(MVAPICH, tuple(argv + _rank_argv(job)), {})


def _slurm(job: ClusterJob, environ: Mapping[str, str]) -> ClusterCommand:
    ppn = _check_ranks(SLURM, job, same_count=True)
    argv = ["srun", "-n", str(_total(job)), "--nodes", str(len(job.nodes))]
    argv += ["--nodelist", _hosts(job), "--ntasks-per-node", str(ppn)]
    argv += shlex.split(job.launcher_args)
    if job.slurm_comment:
        argv += ["--comment", job.slurm_comment]
    exports = ["ALL"]
    for key, value in _rank_env(job, {}).items():
        if "," in value:
            raise ValueError(
                f"--launcher slurm: {key}={value!r} holds a comma, which srun's --export list "
                f"cannot carry; set it in the job's environment (srun passes it on with ALL)"
            )
        exports.append(f"{key}={value}")
    return ClusterCommand(
        SLURM, tuple(argv + [f"--export={','.join(exports)}"] + _rank_argv(job)), {}
    )


_BUILDERS: Dict[str, Callable[[ClusterJob, Mapping[str, str]], ClusterCommand]] = {
    PDSH: _pdsh,
    OPENMPI: _openmpi,
    MPICH: _mpich,
    IMPI: _impi,
    SLURM: _slurm,
    MVAPICH: _mvapich,
}


def _check_ranks(launcher: str, job: ClusterJob, same_count: bool) -> int:
    """For launchers that start the ranks themselves: refuses what only the agent does and
    slots they cannot place (module docstring); the ranks per node."""
    agent_only = [
        (job.max_restarts, f"--max_restarts {job.max_restarts}", "restart options"),
        (job.rank_log_dir, f"--enable_each_rank_log {job.rank_log_dir}", "output options"),
        (job.bind_cores_to_rank and launcher != IMPI, "--bind_cores_to_rank", "binding options"),
    ]
    for on, flag, own in agent_only:
        if on:
            raise NotImplementedError(
                f"{flag} with --launcher {launcher}: {launcher} starts the ranks itself, without "
                f"zerostream's agent that does this; use --launcher pdsh or ssh, or {launcher}'s "
                f"{own} through --launcher_args"
            )
    for node in job.nodes:
        if node.slots != tuple(range(len(node.slots))):
            raise ValueError(
                f"--launcher {launcher}: host {node.name!r} would run slots "
                f"{','.join(str(s) for s in node.slots)}; {launcher} gives a node's ranks its "
                f"first devices (the local rank picks one), so use a host's first N slots "
                f"(--num_gpus N, or --include HOST:0,...,N-1)"
            )
    counts = [len(n.slots) for n in job.nodes]
    if same_count and len(set(counts)) > 1:
        each = ", ".join(f"{n.name}: {len(n.slots)}" for n in job.nodes)
        raise ValueError(
            f"--launcher {launcher} starts the same number of ranks on every node; the hosts "
            f"have different slot counts ({each}): use --num_gpus N or --include"
        )
    return counts[0]


def _total(job: ClusterJob) -> int:
    return sum(len(n.slots) for n in job.nodes)


def _hosts(job: ClusterJob) -> str:
    return ",".join(n.name for n in job.nodes)


def _rank_env(job: ClusterJob, defaults: Mapping[str, str], hydra: bool = False) -> Dict[str, str]:
    """Every rank's extra variables: the launcher's defaults, the exports, where rank 0 is;
    the Hydra MPIs also get WORLD_SIZE and LOCAL_SIZE (DeepSpeed's names)."""
    env = {**defaults, **job.exports}
    env["MASTER_ADDR"], env["MASTER_PORT"] = job.master_addr, str(job.master_port)
    if hydra:
        env["WORLD_SIZE"], env["LOCAL_SIZE"] = str(_total(job)), str(len(job.nodes[0].slots))
    return env


def _genv(env: Mapping[str, str]) -> List[str]:
    out: List[str] = []
    for key, value in env.items():
        out += ["-genv", key, value]
    return out


def _rank_argv(job: ClusterJob) -> List[str]:
    """What each rank runs: the user's program itself (no agent, no --local_rank)."""
    program = job.program
    if program.kind == "exec":
        return [program.target, *program.args]
    module = ["-m"] if program.kind == "module" else []
    return [job.python, "-u", *module, program.target, *program.args]


def run(cmd: ClusterCommand) -> int:
    """Runs the launcher to its end; its exit status (128 + N for signal N). Ctrl-C stops it,
    and for pdsh runs its stop command on every node."""
    env = {**os.environ, **cmd.env}
    proc = subprocess.Popen(list(cmd.argv), env=env)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        if cmd.stop_argv:
            subprocess.run(list(cmd.stop_argv), env=env, check=False, timeout=60)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        print(f"zerostream run: interrupted; {cmd.argv[0]} stopped", file=sys.stderr)
        return 130
    return code if code >= 0 else 128 - code

"""Jobs over several hosts: one command line per node, printed, and run over ssh with
`--launcher ssh`.

Each node's line is self-contained: it changes to this directory, sets the environment
variables DeepSpeed forwards to its nodes (and CUDA_VISIBLE_DEVICES when --include/--exclude
picked some of a node's GPUs), and runs `python -m zerostream.launcher` for that node alone
(`--num_nodes N --node_rank i --master_addr FIRST_HOST --master_port P --num_gpus SLOTS`),
which starts its ranks through torch's elastic agent with a static rendezvous at the first
host. A node therefore needs neither the hostfile nor this launcher's flags.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from .resources import Node

# Prefixes of the variables DeepSpeed's multi-node runners export (EXPORT_ENVS), plus
# zerostream's, Gloo's and DeepSpeed's own settings.
EXPORT_PREFIXES = ("NCCL_", "PYTHON", "MLFLOW", "UCX_", "MV2_", "GLOO_", "ZS_", "ZEROSTREAM_")
EXPORT_NAMES = ("DEEPSPEED_TIMEOUT",)
# Lines of KEY=VALUE exported to every node, as DeepSpeed reads them (DS_ENV_FILE or
# .deepspeed_env in the home or the working directory).
DEEPSPEED_ENV_FILE = ".deepspeed_env"
# How long the other nodes get to stop on their own once one failed (their ranks lose their
# peers and fail too) before their ssh sessions are ended.
STOP_GRACE_S = 30.0


def exported_env(environ: Dict[str, str], cwd: str) -> Dict[str, str]:
    out = {k: v for k, v in environ.items() if k.startswith(EXPORT_PREFIXES) or k in EXPORT_NAMES}
    files = [environ["DS_ENV_FILE"]] if environ.get("DS_ENV_FILE") else []
    files += [os.path.join(os.path.expanduser("~"), DEEPSPEED_ENV_FILE)]
    files += [os.path.join(cwd, DEEPSPEED_ENV_FILE)]
    for path in files:
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                key, eq, value = line.partition("=")
                if not eq or not key.strip():
                    raise ValueError(f"{path}:{lineno}: expected KEY=VALUE; got {line!r}")
                out[key.strip()] = value.strip()
    return out


def node_env(node: Node, exported: Dict[str, str]) -> Dict[str, str]:
    env = dict(exported)
    if node.slots != tuple(range(len(node.slots))):  # not simply the first N devices
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in node.slots)
    return env


def python_exec() -> str:
    """The Python each node runs: PYTHON_EXEC (as DeepSpeed's launcher reads it), else this one."""
    return os.environ.get("PYTHON_EXEC", sys.executable)


def agent_flags(
    bind_cores_to_rank: bool,
    bind_core_list: Optional[str],
    rank_log_dir: Optional[str],
    max_restarts: int,
) -> List[str]:
    """The flags about how a node's agent runs its ranks, which every node's command keeps."""
    out = []
    if bind_cores_to_rank:
        out.append("--bind_cores_to_rank")
    if bind_core_list:
        out.append(f"--bind_core_list={bind_core_list}")
    if rank_log_dir:
        out.append(f"--enable_each_rank_log={rank_log_dir}")
    if max_restarts:
        out.append(f"--max_restarts={max_restarts}")
    return out


def node_argv(
    node_rank: int,
    nodes: Sequence[Node],
    master_addr: str,
    master_port: int,
    forwarded: Sequence[str],
    program: Sequence[str],
) -> List[str]:
    """`python -u -m zerostream.launcher ...` for one node; `forwarded` are the launcher
    flags every node keeps (--bind_cores_to_rank, --no_local_rank, --module...)."""
    return [
        python_exec(),
        "-u",
        "-m",
        "zerostream.launcher",
        f"--num_nodes={len(nodes)}",
        f"--node_rank={node_rank}",
        f"--master_addr={master_addr}",
        f"--master_port={master_port}",
        f"--num_gpus={len(nodes[node_rank].slots)}",
        *forwarded,
        *program,
    ]


def shell_line(cwd: str, env: Dict[str, str], argv: Sequence[str]) -> str:
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return f"cd {shlex.quote(cwd)} && " + (assigns + " " if assigns else "") + shlex.join(argv)


def ssh_argv(host: str, line: str, ssh_port: Optional[int], extra: str) -> List[str]:
    ssh = shutil.which("ssh")
    if ssh is None:
        raise ValueError(
            "--launcher ssh: no `ssh` program on PATH (install OpenSSH's client), or run the "
            "printed command on each node yourself"
        )
    argv = [ssh, "-o", "BatchMode=yes"]  # fail instead of waiting for a password
    if ssh_port is not None:
        argv += ["-p", str(ssh_port)]
    return argv + shlex.split(extra) + [host, line]


def run_over_ssh(hosts: Sequence[str], argvs: Sequence[List[str]]) -> int:
    """Runs one ssh session per node; the first node to fail decides the exit status."""
    procs = [subprocess.Popen(argv, stdin=subprocess.DEVNULL) for argv in argvs]
    failed: Optional[int] = None
    deadline = None
    try:
        while any(p.poll() is None for p in procs):
            if failed is None:
                failed = next((i for i, p in enumerate(procs) if p.poll()), None)
                if failed is not None:
                    deadline = time.monotonic() + STOP_GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        _end(procs)
        print("zerostream run: interrupted; ssh sessions ended", file=sys.stderr)
        return 130
    _end(procs)
    if failed is None:
        failed = next((i for i, p in enumerate(procs) if p.returncode), None)
    if failed is None:
        return 0
    code = procs[failed].returncode
    print(
        f"zerostream run: node {failed} ({hosts[failed]}) failed first (exit code {code}); "
        f"its report is above",
        file=sys.stderr,
    )
    return code if code > 0 else 128 - code


def _end(procs: Sequence[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

"""`deepspeed.launcher.runner`: the `deepspeed` command and its helpers, served by zerostream's
launcher (zerostream/launcher/: the flags, hostfiles, --include/--exclude, the world info).

`parse_args` takes DeepSpeed's runner flags: zerostream run's (the same names) and those only
DeepSpeed's runner has, which `main` honours or refuses by name. Its defaults are zerostream
run's (None for a count or a port not given, `--launcher local`). `main` raises ValueError
for bad flags before anything starts, as DeepSpeed's does.

`accelerate launch --use_deepspeed` on several nodes reads DEEPSPEED_ENVIRONMENT_NAME: the
file name of the environment exported to every node (DS_ENV_FILE overrides it, as in
DeepSpeed).
"""

from __future__ import annotations

import argparse
import collections
import os
from typing import Dict, List, Mapping, Optional, Sequence

from zerostream.launcher import cluster, command, nodes, plan, resources

from ..utils.logging import logger
from .constants import (  # noqa: F401  (DeepSpeed's runner module offers these names)
    IMPI_LAUNCHER,
    MPICH_LAUNCHER,
    MVAPICH_LAUNCHER,
    OPENMPI_LAUNCHER,
    PDSH_LAUNCHER,
    SLURM_LAUNCHER,
)
from .multinode_runner import (  # noqa: F401
    IMPIRunner,
    MPICHRunner,
    MVAPICHRunner,
    OpenMPIRunner,
    PDSHRunner,
    SlurmRunner,
)

DLTS_HOSTFILE = plan.DLTS_HOSTFILE
# Prefixes of the variables every node gets (DeepSpeed's names carry no trailing "_").
EXPORT_ENVS = [p.rstrip("_") for p in nodes.EXPORT_PREFIXES]
DEEPSPEED_ENVIRONMENT_NAME = os.getenv("DS_ENV_FILE", ".deepspeed_env")
DEEPSPEED_ENVIRONMENT_PATHS = [os.path.expanduser("~"), "."]
PDSH_MAX_FAN_OUT = cluster.PDSH_FAN_OUT


def parse_args(args: Optional[List[str]] = None) -> argparse.Namespace:
    """DeepSpeed's runner flags (abbreviations allowed, as in DeepSpeed's parser)."""
    parser = argparse.ArgumentParser(prog="deepspeed", description=command.DESCRIPTION)
    command.add_arguments(parser)
    only = parser.add_argument_group("DeepSpeed's runner only")
    only.add_argument(
        "--no_ssh_check",
        action="store_true",
        help="accepted: zerostream makes no ssh check (ssh runs with BatchMode, so a host that "
        "asks for a password fails at once)",
    )
    only.add_argument("--force_multi", action="store_true", help="refused")
    only.add_argument("--save_pid", action="store_true", help="refused")
    only.add_argument("--autotuning", default="", choices=["tune", "run"], help="refused")
    only.add_argument(
        "--venv_script", default=None, help="sourced on each node first (--launcher pdsh)"
    )
    only.add_argument(
        "--log_level",
        default=None,
        choices=["debug", "info", "warning", "error", "critical"],
        help="sets the level of the `deepspeed` (zerostream) logger (default: left as it is)",
    )
    only.add_argument("-q", "--quiet", action="store_true", help="--log_level error")
    return parser.parse_args(args=args)


def _refuse_unsupported(args: argparse.Namespace) -> None:
    refused = {
        "--autotuning": (args.autotuning, "DeepSpeed's autotuner is not part of zerostream"),
        "--force_multi": (
            args.force_multi,
            "a hostfile whose one host is not this machine already starts it as a node",
        ),
        "--save_pid": (args.save_pid, "zerostream run writes no pid file"),
        "--venv_script": (
            args.venv_script and args.launcher != cluster.PDSH,
            f"only --launcher pdsh sources it on each node (got --launcher {args.launcher})",
        ),
    }
    for flag, (given, why) in refused.items():
        if given:
            raise NotImplementedError(f"{flag}: {why}")


def main(args: Optional[List[str]] = None) -> int:
    """`deepspeed [launcher options] script.py [script args]`: zerostream run; the exit status."""
    parsed = parse_args(args)
    _refuse_unsupported(parsed)
    if parsed.quiet or parsed.log_level:
        logger.setLevel("ERROR" if parsed.quiet else parsed.log_level.upper())
    return command.execute(parsed)


def fetch_hostfile(hostfile_path: str) -> Optional["collections.OrderedDict[str, int]"]:
    """{host: slot count} of the hostfile, or None (with a warning) when there is none."""
    if not os.path.isfile(hostfile_path):
        logger.warning("no hostfile at %s: the job runs on this machine only", hostfile_path)
        return None
    hosts = resources.parse_hostfile(hostfile_path)
    return collections.OrderedDict((h.name, h.slots) for h in hosts.values())


def _parse_hostfile(hostfile_lines: Sequence[str]) -> "collections.OrderedDict[str, int]":
    """{host: slot count} of a hostfile's lines; ValueError naming the bad line."""
    text = "\n".join(line.rstrip("\n") for line in hostfile_lines)
    hosts = resources.parse_hostfile_text(text, "<hostfile>")
    return collections.OrderedDict((h.name, h.slots) for h in hosts.values())


def parse_resource_filter(
    host_info: Mapping[str, Sequence[int]], include_str: str = "", exclude_str: str = ""
) -> "collections.OrderedDict[str, List[int]]":
    """{host: [slots]} after --include or --exclude (zerostream's resources.filter_slots)."""
    return resources.filter_slots(host_info, include_str, exclude_str)


def parse_inclusion_exclusion(
    resource_pool: Mapping[str, int], inclusion: str, exclusion: str
) -> "collections.OrderedDict[str, List[int]]":
    """The active {host: [slots]} of a {host: slot count} pool."""
    pool = collections.OrderedDict((h, list(range(n))) for h, n in resource_pool.items())
    return resources.filter_slots(pool, inclusion, exclusion)


def encode_world_info(world_info: Dict[str, Sequence[int]]) -> str:
    """The world info word every node's launcher gets (Note [World info], resources.py)."""
    return resources.encode_world_info(world_info)

"""`deepspeed.launcher.multinode_runner`: DeepSpeed's runner classes, each a thin name over
one of zerostream's cluster launchers (zerostream/launcher/cluster.py builds every command).

A runner takes `runner.parse_args`'s namespace and the base64 world info, collects the
variables every rank gets (`add_export`), and `get_cmd(environment, active_resources)`
returns the command for the hosts and slots of `active_resources` ({host: [slots]}, or
{host: count} for a host's first slots). Where zerostream differs from DeepSpeed, it says so
instead of running something else:

- the MPI and SLURM commands start the hosts of `active_resources` (DeepSpeed's start every
  host of `resource_pool` and so refuse --include/--exclude); a host's slots must be its
  first N, as each rank takes the device of its local rank;
- pdsh's nodes run zerostream's launcher, which reads the world info of `active_resources`;
- MVAPICH2 gets its hosts with -hosts, no file in /tmp;
- --bind_cores_to_rank, --max_restarts and --enable_each_rank_log with a launcher that
  starts the ranks itself raise NotImplementedError (Intel MPI binds cores with numactl).
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Dict, List, Mapping, Sequence, Union

from zerostream.launcher import cluster, plan
from zerostream.launcher.local import DEFAULT_MASTER_PORT
from zerostream.launcher.resources import Node

# DeepSpeed's rule for an export value that needs quoting: anything but word characters and
# @ % + = : , . / -
_SHELL_SPECIAL = re.compile(r"[^\w@%+=:,./-]")


class MultiNodeRunner:
    """One cluster launcher (`launcher`, a zerostream.launcher.cluster name) for a job."""

    launcher = ""

    def __init__(self, args, world_info_base64: str):
        self.args = args
        self.validate_args()
        self.user_arguments = self.parse_user_args()
        self.user_script = args.user_script
        self.world_info_base64 = world_info_base64
        self.exports: Dict[str, str] = {}
        self._export_values: Dict[str, str] = {}

    @property
    def name(self) -> str:
        return self.launcher

    def backend_exists(self) -> bool:
        return shutil.which(cluster.PROGRAMS[self.launcher]) is not None

    def validate_args(self) -> None:
        """The flag combinations are checked when the command is built (cluster.py)."""

    def parse_user_args(self) -> List[str]:
        # The builders quote the script's arguments for the shell where one runs them.
        return list(self.args.user_args)

    def add_export(self, key: str, var: str) -> None:
        """`exports[key]` as DeepSpeed shows it: a value with characters a shell reads
        specially (e.g. SLURM's `64(x2)`) in double quotes. The commands are built from the
        value itself, quoted once where they are (zerostream/launcher/)."""
        key, var = key.strip(), var.strip()
        self._export_values[key] = var
        self.exports[key] = f'"{var}"' if _SHELL_SPECIAL.search(var) else var

    def _export_env(self) -> Dict[str, str]:
        """The exports' values for the builders: what add_export was given (an entry set
        in `exports` directly is taken as it is)."""
        out = {}
        for key, shown in self.exports.items():
            given = self._export_values.get(key)
            quoted = given is not None and shown == f'"{given}"'
            out[key] = given if quoted else shown
        return out

    def get_cmd(self, environment, active_resources: Mapping[str, Union[int, Sequence[int]]]):
        cmd = self._command(environment, active_resources)
        environment.update(cmd.env)
        return list(cmd.argv)

    def _command(self, environment, active_resources) -> cluster.ClusterCommand:
        nodes = [
            Node(host, tuple(range(slots)) if isinstance(slots, int) else tuple(slots))
            for host, slots in active_resources.items()
        ]
        if not nodes:
            raise ValueError(f"{self.name}: active_resources names no host")
        job = plan.cluster_job(
            self.args,
            nodes,
            self.args.master_addr or nodes[0].name,
            self.args.master_port or DEFAULT_MASTER_PORT,
            self._export_env(),
            os.path.abspath("."),
        )
        return cluster.command(self.launcher, job, environment)


class PDSHRunner(MultiNodeRunner):
    launcher = cluster.PDSH

    def get_cmd(self, environment, active_resources):
        """(command, the command that stops every node's launcher, environment)."""
        cmd = self._command(environment, active_resources)
        environment.update(cmd.env)
        return list(cmd.argv), list(cmd.stop_argv), environment


class _PoolRunner(MultiNodeRunner):
    """The runners DeepSpeed also hands the hostfile's resource pool."""

    def __init__(self, args, world_info_base64: str, resource_pool):
        super().__init__(args, world_info_base64)
        self.resource_pool = resource_pool


class OpenMPIRunner(_PoolRunner):
    launcher = cluster.OPENMPI


class MPICHRunner(_PoolRunner):
    launcher = cluster.MPICH


class IMPIRunner(_PoolRunner):
    launcher = cluster.IMPI


class SlurmRunner(_PoolRunner):
    launcher = cluster.SLURM


class MVAPICHRunner(_PoolRunner):
    launcher = cluster.MVAPICH


__all__ = [
    "MultiNodeRunner",
    "PDSHRunner",
    "OpenMPIRunner",
    "MPICHRunner",
    "IMPIRunner",
    "SlurmRunner",
    "MVAPICHRunner",
]

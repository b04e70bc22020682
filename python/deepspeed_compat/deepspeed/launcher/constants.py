"""`deepspeed.launcher.constants`: the names `--launcher` takes, from zerostream's cluster.py."""

from zerostream.launcher import cluster

PDSH_LAUNCHER = cluster.PDSH
PDSH_MAX_FAN_OUT = cluster.PDSH_FAN_OUT
OPENMPI_LAUNCHER = cluster.OPENMPI
MPICH_LAUNCHER = cluster.MPICH
IMPI_LAUNCHER = cluster.IMPI
SLURM_LAUNCHER = cluster.SLURM
MVAPICH_LAUNCHER = cluster.MVAPICH
# DeepSpeed writes MVAPICH2's host list here; zerostream's command passes it with -hosts and
# writes no file. The name stays for code that imports it.
MVAPICH_TMP_HOSTFILE = "/tmp/deepspeed_mvapich_hostfile"
# DeepSpeed's elastic-training run id; `zerostream run` refuses elastic training.
ELASTIC_TRAINING_ID_DEFAULT = "123456789"

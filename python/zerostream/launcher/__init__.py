"""`zerostream run`: DeepSpeed's launcher flags on torch's elastic agent.

- command.py   the flags, `add_parser(subparsers)`, `run(args)`, `main(argv)`
- plan.py      flags -> this node's share (NodeRun + Program), one command per node, or a
               cluster launcher's command
- resources.py hostfile, --include/--exclude and the world info handed to nodes (pure)
- cores.py     --bind_cores_to_rank: disjoint core sets per local rank (pure)
- numa.py      numactl in front of a rank an MPI starts: its cores and memory node
- cluster.py   pdsh, Open MPI, MPICH, Intel MPI, MVAPICH2 and srun command lines
- local.py     this node's ranks through torch.distributed.launcher.api.elastic_launch
- failures.py  the report naming the rank that failed first
- nodes.py     per-node command lines, ssh
- _child.py    run in each rank before the user's program (stdlib only)
- ports.py     a free port for a job's store, outside the kernel's ephemeral range
"""

from .command import add_arguments, add_parser, execute, main, run

__all__ = ["add_arguments", "add_parser", "execute", "main", "run"]

"""`zerostream run`: DeepSpeed's launcher flags on torch's elastic agent.

- command.py   the flags, `add_parser(subparsers)`, `run(args)`, `main(argv)`
- plan.py      flags -> this node's share (NodeRun + Program) or one command per node
- resources.py hostfile and --include/--exclude (pure)
- cores.py     --bind_cores_to_rank: disjoint core sets per local rank (pure)
- local.py     this node's ranks through torch.distributed.launcher.api.elastic_launch
- failures.py  the report naming the rank that failed first
- nodes.py     per-node command lines, ssh
- _child.py    run in each rank before the user's program (stdlib only)
- ports.py     a free port for a job's store, outside the kernel's ephemeral range
"""

from .command import add_arguments, add_parser, main, run

__all__ = ["add_arguments", "add_parser", "main", "run"]

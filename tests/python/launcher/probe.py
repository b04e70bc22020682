"""One rank of the launcher tests: all-reduces rank + 1 over Gloo and writes what the launcher
gave it (argv, environment, cores, the sum) to $PROBE_OUT/rank<RANK>.json."""

import json
import os
import sys

import torch
import torch.distributed as dist

KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "LOCAL_SIZE",
    "GROUP_RANK",
    "CROSS_RANK",
    "CROSS_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
)

if __name__ == "__main__":
    torch.set_num_threads(1)  # ranks share 2 cores
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    record = {
        "argv": sys.argv,
        "env": {k: os.environ.get(k) for k in KEYS},
        "cores": sorted(os.sched_getaffinity(0)),
        "sum": total.item(),
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "path0": sys.path[0],
    }
    path = os.path.join(os.environ["PROBE_OUT"], f"rank{dist.get_rank()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)
    dist.destroy_process_group()

"""Rank 1 raises ValueError("boom-rank-1") once both ranks joined; rank 0 would sleep for ten
minutes, so the job ends in time only if the launcher stops it. Each rank writes its pid to
$PROBE_OUT/pid<RANK> first."""

import os
import time

import torch.distributed as dist

if __name__ == "__main__":
    rank = int(os.environ["RANK"])
    with open(os.path.join(os.environ["PROBE_OUT"], f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))
    dist.init_process_group("gloo")
    if rank == 1:
        raise ValueError("boom-rank-1")
    time.sleep(600)

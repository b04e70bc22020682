"""One rank of a job that may span "nodes" (several `zerostream run --node_rank N` processes on
this machine), for test_run_multinode.py: checkpoint_run's TinyGPT under ZeRO-3 with the
parameters and the optimizer offloaded to NVMe, over one fixed global batch per step.

    multinode_train.py OUT NVME_ROOT CKPT MODE

NVME_ROOT is this node's own swap folder (as on separate hosts; each node's command names
its own); CKPT is the job's checkpoint folder (a shared filesystem: checkpoint.use_node_local
_storage across hosts is refused, see checkpoint/save.py). MODE:
- "first": steps [0, K), save, steps [K, 2K) (the uninterrupted run);
- "resume": other initial weights, load CKPT, steps [K, 2K).
Each rank writes OUT/MODE-rank{RANK}.json: the global losses, the world, its node and the
files its swap folder held after training (name, bytes allocated on the disk), before
they are removed. Every param shard is on the disk (offload_param.max_in_cpu 0).
"""

import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "checkpoint"))
from ckpt_run import STEPS, build, train  # noqa: E402

CASE = (3, "nvme", "nvme", "fp32")
K = STEPS // 2


def swap_files(root: str) -> list:
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            found.append([os.path.relpath(path, root), os.stat(path).st_blocks * 512])
    return sorted(found)


def main() -> None:
    out, nvme_root, ckpt, mode = sys.argv[1:5]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    engine = build(CASE, world, nvme_root, seed=0 if mode == "first" else 1, param_max_in_cpu=0)
    if mode == "first":
        losses = train(engine, rank, world, 0, K)
        engine.save_checkpoint(ckpt, client_state={"resume_at": K})
    else:
        _, client = engine.load_checkpoint(ckpt)
        if client["resume_at"] != K or engine.global_steps != K:
            raise SystemExit(f"rank {rank}: loaded {client} at step {engine.global_steps}")
        losses = []
    losses += train(engine, rank, world, K, K)
    record = {
        "losses": losses,
        "world": world,
        "node": int(os.environ["GROUP_RANK"]),
        "swap": swap_files(nvme_root),
    }
    engine.destroy()
    pathlib.Path(out, f"{mode}-rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()

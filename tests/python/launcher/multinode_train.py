"""One rank of a job that may span "nodes" (several `zerostream run --node_rank N` processes on
this machine), for test_run_multinode.py: bench/gpt.py's GPT (the shape `zerostream estimate`
models) under ZeRO-3 with the parameters and the optimizer offloaded to NVMe, trained as
ckpt_run.py trains (one fixed global batch per step, each rank its slice).

    multinode_train.py OUT NVME_ROOT CKPT MODE

NVME_ROOT is this node's own swap folder (as on separate hosts; each node's command names
its own); CKPT is the job's checkpoint folder (a shared filesystem: checkpoint.use_node_local
_storage across hosts is refused, see checkpoint/save.py). MODE:
- "first": steps [0, K), save, steps [K, 2K) (the uninterrupted run);
- "resume": other initial weights, load CKPT, steps [K, 2K).
Each rank writes OUT/MODE-rank{RANK}.json: the global losses, the collective bytes its
telemetry counted in each step, the world, its node and the files its swap folder held after
training (name, bytes allocated on the disk), before
they are removed. Every param shard is on the disk (offload_param.max_in_cpu 0).
"""

import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "checkpoint"))
from ckpt_run import STEPS, config, train  # noqa: E402

CASE = (3, "nvme", "nvme", "fp32")
K = STEPS // 2
SHAPE = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq": 64}


def job_config(world: int, nvme_root: str) -> dict:
    """ckpt_run's config of CASE, every param shard on the disk (max_in_cpu 0)."""
    return config(CASE, world, os.path.join(nvme_root, "nvme"), param_max_in_cpu=0)


def build(world: int, nvme_root: str, seed: int):
    import torch

    import zerostream
    from zerostream.bench.gpt import GPT, GPTShape

    torch.manual_seed(seed)
    engine, *_ = zerostream.initialize(
        model=GPT(GPTShape(**SHAPE)), config=job_config(world, nvme_root)
    )
    return engine


def steps(engine, rank: int, world: int, first: int, count: int, collectives: list) -> list:
    """ckpt_run.train one step at a time, noting each step's collective bytes."""
    losses = []
    for step in range(first, first + count):
        before = dict(engine.telemetry.bytes)
        losses += train(engine, rank, world, step, 1)
        after = engine.telemetry.bytes
        collectives.append({k: after[k] - before.get(k, 0) for k in engine.telemetry.COLLECTIVES})
    return losses


def swap_files(root: str) -> list:
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            found.append([os.path.relpath(path, root), os.stat(path).st_blocks * 512])
    return sorted(found)


def main() -> None:
    import torch

    out, nvme_root, ckpt, mode = sys.argv[1:5]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    engine = build(world, nvme_root, seed=0 if mode == "first" else 1)
    collectives: list = []
    if mode == "first":
        losses = steps(engine, rank, world, 0, K, collectives)
        engine.save_checkpoint(ckpt, client_state={"resume_at": K})
    else:
        _, client = engine.load_checkpoint(ckpt)
        if client["resume_at"] != K or engine.global_steps != K:
            raise SystemExit(f"rank {rank}: loaded {client} at step {engine.global_steps}")
        losses = []
    losses += steps(engine, rank, world, K, K, collectives)
    # A node's ranks share its swap folder: list it only while no rank has begun to
    # destroy its engine (which deletes its swap files), and destroy only after all listed.
    torch.distributed.barrier()
    record = {
        "losses": losses,
        "collectives": collectives,
        "world": world,
        "node": int(os.environ["GROUP_RANK"]),
        "swap": swap_files(nvme_root),
    }
    torch.distributed.barrier()
    engine.destroy()
    pathlib.Path(out, f"{mode}-rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()

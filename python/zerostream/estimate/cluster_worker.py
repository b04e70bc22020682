"""One rank of `python -m zerostream.estimate.cluster_check`, started by `zerostream run` on
every "node": trains bench/gpt.py's GPT under the given ds_config (each node swaps to its
own folder, NVME_ROOT/node{GROUP_RANK}), then times the collectives alone, and rank 0
writes OUT: per-step bytes and seconds of each telemetry tier, the step time, and the
measured ring model of this machine's collectives (a latency per hop and a bandwidth).

    python -m zerostream.estimate.cluster_worker SPEC.json OUT.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch


def _delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items()}


def ring_model(world: int, group=None, reps: int = 5) -> dict:
    """Per collective kind, a latency per ring hop and a bandwidth per rank (GB/s of
    (N - 1) / N of the payload) fitted to a small and a large payload over this job's
    ranks, each kind timed as the backend runs it (Gloo's reduce-scatter is not a ring)."""
    import torch.distributed as dist

    def all_gather(numel):
        out = torch.empty(numel)
        return lambda send: dist.all_gather_into_tensor(out, send, group=group)

    def reduce_scatter(numel):
        out = torch.empty(numel // world)
        return lambda send: dist.reduce_scatter_tensor(out, send, group=group)

    model = {}
    for kind, make, part in (
        ("all_gather", all_gather, True),
        ("reduce_scatter", reduce_scatter, False),
    ):
        times = {}
        for numel in (1 << 14, 1 << 21):  # 64 KiB, 8 MiB of fp32 in all
            run = make(numel)
            send = torch.ones(numel // world if part else numel)
            samples = []
            for _ in range(reps + 1):
                dist.barrier(group)
                start = time.perf_counter()
                run(send)
                samples.append(time.perf_counter() - start)
            times[numel * 4] = statistics.median(samples[1:])
        (small, t_small), (large, t_large) = sorted(times.items())
        ring = (world - 1) / world
        gbps = ring * (large - small) / max(t_large - t_small, 1e-9) / 1e9
        latency = max(t_small - ring * small / (gbps * 1e9), 0.0) / (world - 1)
        model[kind] = {"gbps": gbps, "latency_us": latency * 1e6, "samples": times}
    return model


def main(argv=None) -> int:
    import torch.distributed as dist

    import zerostream
    from zerostream.bench.gpt import GPT, GPTShape, batches

    spec_path, out_path = (argv or sys.argv[1:])[:2]
    with open(spec_path) as f:
        spec = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    node = int(os.environ["GROUP_RANK"])
    cfg = spec["config"]  # this process's own copy, read from the file
    nvme = os.path.join(spec["nvme_root"], f"node{node}")
    for key in ("offload_optimizer", "offload_param"):
        section = cfg["zero_optimization"].get(key)
        if section and section.get("device") == "nvme":
            section["nvme_path"] = nvme
    shape = GPTShape(**spec["shape"])
    torch.manual_seed(0)
    engine, *_ = zerostream.initialize(model=GPT(shape), config=cfg)
    data = batches(shape, cfg["train_micro_batch_size_per_gpu"], torch.device("cpu"), seed=rank)
    steps, warmup = spec["steps"], spec["warmup"]
    before, times, each = None, [], []
    for i in range(warmup + steps):
        if i == warmup:
            before = engine.telemetry.snapshot()
        last = engine.telemetry.snapshot()["bytes"]
        dist.barrier()
        start = time.perf_counter()
        for _ in range(engine.gradient_accumulation_steps()):
            x, y = next(data)
            engine.backward(engine(x, y))
            engine.step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
        each.append(_delta(engine.telemetry.snapshot()["bytes"], last))
    after = engine.telemetry.snapshot()
    engine.destroy()
    ring = ring_model(world)
    result = {
        "rank": rank,
        "bytes": {k: v / steps for k, v in _delta(after["bytes"], before["bytes"]).items()},
        "seconds": {
            k: v / steps for k, v in _delta(after["tier_seconds"], before["tier_seconds"]).items()
        },
        "phases": {k: v / steps for k, v in _delta(after["seconds"], before["seconds"]).items()},
        "calls": {k: v / steps for k, v in _delta(after["calls"], before["calls"]).items()},
        "step_seconds": statistics.median(times),
        "bytes_each_step": each,  # warm-up steps included
        "ring": ring,
    }
    everyone = [None] * world
    dist.all_gather_object(everyone, result)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(everyone, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

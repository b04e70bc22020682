"""What the checkpoint tests run on each rank: a TinyGPT trained by a zerostream engine over
one fixed global batch per step (each rank takes its slice), with AdamW, clipping and a
warm-up schedule, so resumed and uninterrupted runs can be compared step by step."""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tiny_gpt import TinyGPT, make_batches  # noqa: E402

GLOBAL_BATCH = 8
STEPS = 8


def case_id(case) -> str:
    return "-".join(str(c) for c in case)


def config(case, world: int, nvme: str, param_max_in_cpu=None) -> dict:
    """case = (stage, offload_optimizer, offload_param, dtype); `param_max_in_cpu` sets
    offload_param.max_in_cpu (0: every param shard on the disk)."""
    stage, off_opt, off_param, dtype = case
    zero = {"stage": stage, "reduce_bucket_size": 3000, "sub_group_size": 2000}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 64
    if off_opt != "none":
        zero["offload_optimizer"] = {"device": off_opt, "nvme_path": nvme}
    if off_param != "none":
        zero["offload_param"] = {"device": off_param, "nvme_path": nvme}
        if param_max_in_cpu is not None:
            zero["offload_param"]["max_in_cpu"] = param_max_in_cpu
    return {
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 6}},
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == "bf16"},
    }


def build(
    case, world: int, root: str, seed: int = 0, freeze=(), param_max_in_cpu=None, **model_kwargs
):
    """`freeze`: names of parameters that do not train (requires_grad False)."""
    import zerostream

    torch.manual_seed(seed)
    model = TinyGPT(**model_kwargs)
    for name, p in model.named_parameters():
        if name in freeze:
            p.requires_grad_(False)
    nvme = os.path.join(root, "nvme", case_id(case))
    trained = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = zerostream.initialize(
        model=model,
        model_parameters=trained,
        config=config(case, world, nvme, param_max_in_cpu),
    )
    return engine


def train(engine, rank: int, world: int, first: int, count: int):
    """Steps [first, first + count); returns the global (rank-averaged) losses."""
    import torch.distributed as dist

    xs, ys = make_batches(STEPS * 2, GLOBAL_BATCH)
    micro = GLOBAL_BATCH // world
    rows = slice(rank * micro, (rank + 1) * micro)
    losses = []
    for s in range(first, first + count):
        loss = engine(xs[s][rows], ys[s][rows])
        engine.backward(loss)
        engine.step()
        value = loss.detach().float().reshape(1)
        if world > 1:
            dist.all_reduce(value)
        losses.append(float(value) / world)
    return losses

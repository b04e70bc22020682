"""The calls DeepSpeed's own example scripts make, through `import deepspeed`, on the ranks
torch.distributed.run starts (test_deepspeed_scripts.py). Those scripts are third-party files
and not copied here; this one makes the same calls in the same way:

* DeepSpeedExamples training/cifar/cifar10_deepspeed.py: add_config_arguments,
  init_distributed, get_accelerator().set_device / device_name, the MoE param-group helper,
  initialize(args, model, model_parameters, training_data, config=dict) and its dataloader,
  bfloat16_enabled / fp16_enabled, engine(x) -> criterion -> backward -> step; an "Adam" +
  WarmupLR config with clipping.
* DeepSpeed tests/small_model_debugging/test_model.py: `import deepspeed.comm as dist`, a
  model whose forward takes (x, y) and returns the loss and applies one Linear twice, a config
  file given as args.deepspeed_config, initialize(args, model, model_parameters=generator,
  dist_init_required=True), a DistributedSampler loader sized by
  train_micro_batch_size_per_gpu() on engine.device, tiny reduce buckets.

Every step's loss is compared with plain PyTorch trained on the union of the ranks' batches
(gathered from what each rank really consumed). Rank 0 prints one JSON line.
"""

import argparse
import json
import math
import os

import deepspeed
import deepspeed.comm as dist
import torch
import torch.nn.functional as F
from deepspeed.accelerator import get_accelerator
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

STEPS = 4
MAX_LR = 1e-3
WARMUP = 1000


class Net(torch.nn.Module):
    """A small convolutional classifier in the CIFAR example's shape (conv-pool-conv-fc)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 4, 3)
        self.conv2 = torch.nn.Conv2d(4, 6, 3)
        self.fc1 = torch.nn.Linear(6 * 2 * 2, 16)
        self.fc2 = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class SharedLinear(torch.nn.Module):
    """forward(x, y) -> loss, one Linear applied twice (test_model.py's SimpleModel)."""

    def __init__(self, hidden):
        super().__init__()
        self.linear = torch.nn.Linear(hidden, hidden, bias=False)

    def forward(self, x, y):
        return F.cross_entropy(self.linear(self.linear(x)), y)


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--moe-param-group", action="store_true")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def gathered(t):
    """Every rank's tensor, concatenated in rank order (the global batch)."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


def plain_reference(model, batches, lrs, forward_loss, world):
    """Plain torch AdamW (DeepSpeed's "Adam"), clipping at 1.0, on the global batches."""
    opt = torch.optim.AdamW(model.parameters(), lr=lrs[0], betas=(0.8, 0.999), weight_decay=0.0)
    losses = []
    for (x, y), lr in zip(batches, lrs):
        for group in opt.param_groups:
            group["lr"] = lr
        per_rank = zip(x.chunk(world), y.chunk(world))
        loss = sum(forward_loss(model, xr, yr) for xr, yr in per_rank) / world
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def cifar_like(args, stage, world):
    """cifar10_deepspeed.py's calls; log warmup from 0 (WarmupLR): step s trains with
    lr = MAX_LR * ln(s) / ln(WARMUP) (0 for s = 0 and 1)."""
    torch.manual_seed(0)
    net = Net()
    initial = {k: v.clone() for k, v in net.state_dict().items()}
    g = torch.Generator().manual_seed(7)
    trainset = torch.utils.data.TensorDataset(
        torch.randn(STEPS * 16, 3, 14, 14, generator=g),
        torch.randint(0, 10, (STEPS * 16,), generator=g),
    )
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    if args.moe_param_group:
        parameters = split_params_into_different_moe_groups_for_optimizer(
            {"params": [p for p in net.parameters()], "name": "parameters"}
        )
    ds_config = {
        "train_batch_size": 16,
        "steps_per_print": 2000,
        "optimizer": {
            "type": "Adam",
            "params": {"lr": MAX_LR, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 0.0},
        },
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0, "warmup_max_lr": MAX_LR, "warmup_num_steps": WARMUP},
        },
        "gradient_clipping": 1.0,
        "prescale_gradients": False,
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
        "zero_optimization": {
            "stage": stage,
            "allgather_partitions": True,
            "reduce_scatter": True,
            "allgather_bucket_size": 50000000,
            "reduce_bucket_size": 50000000,
            "overlap_comm": True,
            "contiguous_gradients": True,
            "cpu_offload": False,
        },
    }
    engine, _, trainloader, _ = deepspeed.initialize(
        args=args, model=net, model_parameters=parameters, training_data=trainset, config=ds_config
    )
    local_device = get_accelerator().device_name(engine.local_rank)
    target_dtype = torch.bfloat16 if engine.bfloat16_enabled() else None
    target_dtype = torch.half if engine.fp16_enabled() else target_dtype
    criterion = torch.nn.CrossEntropyLoss()
    losses, batches = [], []
    for inputs, labels in trainloader:
        inputs, labels = inputs.to(local_device), labels.to(local_device)
        if target_dtype is not None:
            inputs = inputs.to(target_dtype)
        loss = criterion(engine(inputs), labels)
        engine.backward(loss)
        engine.step()
        losses.append(float(gathered(loss.detach().reshape(1)).mean()))
        batches.append((gathered(inputs), gathered(labels)))
    engine.destroy()
    ref = Net()
    ref.load_state_dict(initial)
    lrs = [0.0 if s < 2 else MAX_LR * math.log(s) / math.log(WARMUP) for s in range(len(batches))]
    reference = plain_reference(ref, batches, lrs, lambda m, x, y: criterion(m(x), y), world)
    return {"losses": losses, "reference": reference, "steps": len(losses)}


def model_like(args, stage, world):
    """test_model.py's calls (fp32 here: the CPU has no fast fp16)."""
    hidden = 32
    rank = int(os.environ["RANK"])
    torch.random.manual_seed(2222 + rank)
    model = SharedLinear(hidden)
    torch.manual_seed(0)  # the same start on every rank and in the reference
    with torch.no_grad():
        model.linear.weight.copy_(torch.randn(hidden, hidden) * 0.1)
    initial = model.linear.weight.detach().clone()
    config = {
        "train_batch_size": 8 * world,
        "steps_per_print": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 0.00015, "betas": [0.8, 0.999]}},
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": 20,
            "zero_hpz_partition_size": 1,
            "reduce_scatter": True,
            "zero_quantized_weights": False,
            "zero_quantized_gradients": False,
        },
    }
    path = os.path.join(args.out, f"temp_config_{stage}_{rank}.json")
    with open(path, "w") as f:
        json.dump(config, f)
    args.deepspeed_config = path
    model, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), dist_init_required=True
    )
    args.deepspeed_config = None
    torch.random.manual_seed(2222 + rank)
    total = STEPS * model.train_micro_batch_size_per_gpu() * world
    data = torch.randn(total, hidden, device=model.device)
    label = torch.empty(total, dtype=torch.long, device=model.device).random_(hidden)
    dataset = torch.utils.data.TensorDataset(data, label)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=model.train_micro_batch_size_per_gpu(), sampler=sampler
    )
    losses, batches = [], []
    for x, y in loader:
        loss = model(x, y)
        model.backward(loss)
        model.step()
        losses.append(float(gathered(loss.detach().reshape(1)).mean()))
        batches.append((gathered(x), gathered(y)))
    model.destroy()
    ref = SharedLinear(hidden)
    with torch.no_grad():
        ref.linear.weight.copy_(initial)
    lrs = [0.00015] * len(batches)
    reference = plain_reference(ref, batches, lrs, lambda m, x, y: m(x, y), world)
    return {"losses": losses, "reference": reference, "steps": len(losses)}


def main():
    args = parse_args()
    deepspeed.init_distributed()
    local_rank = int(os.environ.get("LOCAL_RANK"))
    get_accelerator().set_device(local_rank)
    world = dist.get_world_size()
    out = {"world": world, "args_local_rank": None}
    for stage in (0, 1, 2, 3):
        out[f"cifar_stage{stage}"] = cifar_like(args, stage, world)
        out["args_local_rank"] = args.local_rank
    for stage in (0, 1, 2):
        out[f"test_model_stage{stage}"] = model_like(args, stage, world)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Ops dispatched per training-step phase, zerostream against plain torch, counted on the
simulated device (zerostream/testing/sim_device.py): on a GPU each non-view op is a kernel
launch, so the difference shows what a phase adds beside the math.

    PYTHONPATH=python .venv/bin/python scripts/sim-op-count.py [--size small] [--stage 2]
        [--offload-optimizer none|cpu] [--by-name]

One rank, bf16, GPT of bench step's sizes; torch is bench step's torch peer (fused AdamW,
clipping). Prints (forward, backward, step) counts for three steps of each, and with
--by-name the backward's ops whose counts differ.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from collections import Counter

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import zerostream  # noqa: E402
from zerostream.bench.gpt import GPT, SIZES, batches  # noqa: E402
from zerostream.launcher.ports import free_port  # noqa: E402
from zerostream.testing import sim_device  # noqa: E402

STEPS, MICRO = 3, 4


class _Names(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _zerostream(sim, shape, args, names):
    torch.manual_seed(0)
    zero = {"stage": args.stage}
    if args.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": args.offload_optimizer}
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
        "zero_optimization": zero,
        "bf16": {"enabled": True},
    }
    engine = zerostream.initialize(model=GPT(shape), config=cfg)[0]
    data = batches(shape, MICRO, engine.device, seed=0)
    out = _count_steps(sim, data, engine, engine.backward, engine.step, names)
    engine.destroy()
    return out


def _count_steps(sim, data, forward, backward, step, names) -> list:
    """(forward, backward, step) ops of each of STEPS steps; `names` counts the last
    backward's ops by name."""
    out = []
    for i in range(STEPS):
        x, y = next(data)
        a = sim.compute_ops
        loss = forward(x, y)
        b = sim.compute_ops
        with names if i == STEPS - 1 else _Names():
            backward(loss)
        c = sim.compute_ops
        step()
        out.append((b - a, c - b, sim.compute_ops - c))
    return out


def _torch(sim, shape, args, names):
    torch.manual_seed(0)
    device = torch.device("cpu:0")  # the simulated device's name
    model = GPT(shape).to(device, torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    data = batches(shape, MICRO, device, seed=0)

    def step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return _count_steps(sim, data, model, lambda loss: loss.backward(), step, names)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=2)
    p.add_argument("--offload-optimizer", choices=("none", "cpu"), default="none")
    p.add_argument("--by-name", action="store_true")
    args = p.parse_args()
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
    )
    shape = SIZES[args.size]
    print(f"GPT {args.size}: {sum(1 for _ in GPT(shape).parameters())} parameter tensors")
    counted = {}
    for name, run in (("zerostream", _zerostream), ("torch", _torch)):
        names = _Names()
        with sim_device.installed(policy="eager", seed=0, device_index=0) as sim:
            steps = run(sim, shape, args, names)
            sim.violations.clear()
        counted[name] = names.counts
        print(f"{name:10s} (forward, backward, step) per step: {steps}")
    if args.by_name:
        ours, theirs = counted["zerostream"], counted["torch"]
        for op in sorted(set(ours) | set(theirs), key=lambda k: theirs[k] - ours[k]):
            if ours[op] != theirs[op]:
                print(f"  backward {op:24s} zerostream {ours[op]:5d}  torch {theirs[op]:5d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Trains a tiny model under `accelerate launch --use_deepspeed` (test_accelerate.py) with the
CPU recipe of docs/compat.md: the Gloo backend through InitProcessGroupKwargs. Prints
RESULT {...} on the main process: what ran, and the final weights."""

import json

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

STEPS, PER_RANK = 4, 2


def dataset():
    g = torch.Generator().manual_seed(5)
    return torch.randn(STEPS * 2 * PER_RANK, 4, generator=g), torch.randn(
        STEPS * 2 * PER_RANK, 2, generator=g
    )


def main():
    acc = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    x, y = dataset()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=PER_RANK)
    model, opt, data = acc.prepare(model, opt, data)
    for xb, yb in data:
        acc.backward(torch.nn.functional.mse_loss(model(xb), yb))
        opt.step()
        opt.zero_grad()
    weights = [p.detach().flatten().tolist() for p in model.module.parameters()]
    if acc.is_main_process:
        print("RESULT " + json.dumps({
            "processes": acc.num_processes,
            "engine": type(model).__name__,
            "weights": weights,
        }))  # fmt: skip


if __name__ == "__main__":
    main()

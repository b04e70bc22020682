"""A DeepSpeed training script with only the import changed (used by test_engine_loop.py)."""

import argparse

import torch

import zerostream as deepspeed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--out", required=True)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(64, 16, generator=g)
    data = torch.utils.data.TensorDataset(xs, xs.sum(dim=1, keepdim=True))
    engine, optimizer, loader, scheduler = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), training_data=data
    )
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    weights = torch.cat([p.detach().flatten() for p in engine.module.parameters()])
    with open(f"{args.out}.{deepspeed.comm.get_rank()}", "w") as f:
        f.write(
            f"{engine.global_steps} {losses[0]} {losses[-1]} {weights.sum().item():.6f} "
            f"{args.local_rank}\n"
        )


if __name__ == "__main__":
    main()

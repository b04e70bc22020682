"""Issue 12's GPT-2 XL case: a Hugging Face GPT2LMHeadModel at the XL shape (48 layers, hidden
1600, 25 heads, vocab 50257, tied embeddings, 1.56 B parameters), random init, built under
zero.Init and trained at ZeRO stage 3 with `offload_param` and `offload_optimizer` both
"nvme" and every other offload setting at DeepSpeed's defaults (buffer_count 5, buffer_size
1e8, max_in_cpu 1e9): the configuration DeepSpeed 0.19.8 stopped in with "Not enough
buffers 0 for swapping 1". Runs on the GPU when there is one, else on the CPU; one rank,
or as many as `zerostream run --nproc N` starts.

    python benchmarks/hf_gpt2_xl_nvme.py --nvme-path /nvme/zs [--steps 3] [--seq 64]

Prints one line per step (loss, seconds) and a JSON summary: step times, losses, peak RSS,
peak device memory, the swap traffic per step and where the params' shards live."""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import torch


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nvme-path", required=True, help="directory on the disk for swap files")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--layers", type=int, default=48, help="fewer for a quick try")
    return p.parse_args()


def ds_config(args) -> dict:
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
        "bf16": {"enabled": args.precision == "bf16"},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": args.nvme_path},
            "offload_optimizer": {"device": "nvme", "nvme_path": args.nvme_path},
        },
    }


def main() -> int:
    args = parse()
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29571")
    from transformers import AutoModelForCausalLM, GPT2Config
    from transformers.integrations import HfDeepSpeedConfig

    import zerostream

    cfg = ds_config(args)
    shape = GPT2Config(n_layer=args.layers, n_embd=1600, n_head=25, vocab_size=50257)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    start = time.perf_counter()
    torch.manual_seed(0)
    # As a transformers user does: with the ds_config registered, transformers builds the
    # model under zero.Init itself (through the `deepspeed` package zerostream installs)
    # and runs its weight init on gathered parameters.
    hf_ds = HfDeepSpeedConfig(cfg)  # noqa: F841 (transformers holds a weak reference)
    model = AutoModelForCausalLM.from_config(shape, dtype=dtype)
    built = time.perf_counter() - start
    if not all(hasattr(p, "ds_id") for p in model.parameters()):
        raise SystemExit("transformers did not build the model under zero.Init")
    tied = model.lm_head.weight is model.transformer.wte.weight
    params = sum(p.ds_numel for p in model.parameters())
    start = time.perf_counter()
    engine, optimizer, _, _ = zerostream.initialize(model=model, config=cfg)
    initialized = time.perf_counter() - start
    device = engine.device
    g = torch.Generator().manual_seed(1)
    times, losses = [], []
    before = optimizer.state_summary()["params"]["swap"]
    for step in range(args.steps):
        ids = torch.randint(0, shape.vocab_size, (args.micro_batch, args.seq), generator=g)
        ids = ids.to(device)
        start = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        losses.append(float(loss.detach().float()))
        print(f"step {step}: loss {losses[-1]:.4f}, {times[-1]:.2f} s", flush=True)
    summary = optimizer.state_summary()
    swap = summary["params"]["swap"]
    out = {
        "device": str(device),
        "parameters": params,
        "tied_embeddings": tied,
        "config": cfg["zero_optimization"],
        "build_seconds": built,
        "initialize_seconds": initialized,
        "step_seconds": times,
        "losses": losses,
        "param_swap_per_step": {
            k: (swap[k] - before[k]) / args.steps for k in ("bytes_read", "bytes_written")
        },
        "param_buffer_count": swap["buffer_count"],
        "deferred_reads": swap["deferred_reads"],
        "params_on_disk": sum(1 for p in model.parameters() if p._zs.shard is None),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_device_bytes": (
            torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        ),
    }
    print(json.dumps(out))
    engine.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

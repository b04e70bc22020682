"""`zerostream bench optim --model gpt2-small`: the optimizer classes on a real model's
parameter list, the way a training script uses them (one ``step()`` over every tensor),
against torch's and DeepSpeed's in the same run.

A model's list mixes a few big matrices with many small biases and norms (GPT-2 small: 148
tensors, 124.4M params, 74 of them 768 elements). What this adds to the flat-buffer bench:
the per-tensor costs of a ``step()`` (Python, fork/join, idle tails), which zerostream's
group step pays once per group (Note [Many tensors, one region] in csrc/optim/parallel.h).
fp32 params and grads for every peer (torch and DeepSpeed need grad dtype == param dtype).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

from zerostream.bench import deepspeed_unavailable
from zerostream.ops.adam import DeepSpeedCPUAdam
from zerostream.ops.threads import optimizer_threads


def gpt2_shapes(h: int, layers: int, vocab: int, ctx: int) -> List[Tuple[int, ...]]:
    """A GPT-2's parameters (HF GPT2LMHeadModel order, tied lm_head not repeated)."""
    ff = 4 * h
    shapes: List[Tuple[int, ...]] = [(vocab, h), (ctx, h)]
    for _ in range(layers):
        shapes += [
            (h,),
            (h,),  # ln_1
            (h, 3 * h),
            (3 * h,),  # attn.c_attn
            (h, h),
            (h,),  # attn.c_proj
            (h,),
            (h,),  # ln_2
            (h, ff),
            (ff,),  # mlp.c_fc
            (ff, h),
            (h,),
        ]  # mlp.c_proj
    return shapes + [(h,), (h,)]  # ln_f


MODELS: Dict[str, Callable[[], List[Tuple[int, ...]]]] = {
    "gpt2-small": lambda: gpt2_shapes(768, 12, 50257, 1024),  # 124.4M params, 148 tensors
    "gpt2-tiny": lambda: gpt2_shapes(64, 2, 1000, 128),  # smoke tests
}


def _params(shapes) -> List[torch.nn.Parameter]:
    params = []
    for i, shape in enumerate(shapes):
        p = torch.nn.Parameter(torch.full(shape, 0.01 * (i % 7 + 1)))
        p.grad = torch.full(shape, 1e-3)
        params.append(p)
    return params


def _peers(args, shapes) -> List[Tuple[str, torch.optim.Optimizer]]:
    kw = dict(lr=1e-3, weight_decay=0.01)
    adamw = args.optimizer != "adam"
    torch_cls = torch.optim.AdamW if adamw else torch.optim.Adam
    peers = [
        (
            "zerostream DeepSpeedCPUAdam",
            DeepSpeedCPUAdam(_params(shapes), adamw_mode=adamw, threads=args.threads or None, **kw),
        )
    ]
    if not args.no_torch:
        peers.append(
            (
                f"torch {torch_cls.__name__}(fused=True)",
                torch_cls(_params(shapes), fused=True, **kw),
            )
        )
        peers.append(
            (
                f"torch {torch_cls.__name__}(foreach=True)",
                torch_cls(_params(shapes), foreach=True, **kw),
            )
        )
    if deepspeed_unavailable() is not None:  # absent, or zerostream's compatibility package
        return peers
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam as DSCPUAdam  # type: ignore

        peers.append(
            ("deepspeed DeepSpeedCPUAdam", DSCPUAdam(_params(shapes), adamw_mode=adamw, **kw))
        )
    except Exception:  # its op fails to build: reported as absent
        pass
    return peers


def run_model(args) -> Dict:
    """Measures every peer's step() over the model's list in interleaved rounds."""
    if args.optimizer not in ("adam", "adamw"):
        raise ValueError(
            f"--model: measures Adam/AdamW (the offload optimizer); got "
            f"--optimizer {args.optimizer}"
        )
    shapes = MODELS[args.model]()
    numel = sum(torch.Size(s).numel() for s in shapes)
    peers = _peers(args, shapes)
    times: Dict[str, List[float]] = {name: [] for name, _ in peers}
    for _, opt in peers:  # warm-up: state allocation, first touch
        opt.step()
    for _ in range(args.repeats):
        for name, opt in peers:
            t0 = time.perf_counter()
            opt.step()
            times[name].append(time.perf_counter() - t0)
    ours = times[peers[0][0]]

    def paired(name: Optional[str]) -> Optional[float]:
        if name is None:
            return None
        return statistics.median(o / t for t, o in zip(ours, times[name]))

    find = lambda key: next((n for n in times if key in n), None)  # noqa: E731
    return {
        "config": {
            "model": args.model,
            "optimizer": args.optimizer,
            "tensors": len(shapes),
            "numel": numel,
            "threads": optimizer_threads(args.threads or None),
            "repeats": args.repeats,
        },
        "peers": [
            {
                "name": n,
                "ms_per_step": statistics.median(t) * 1e3,
                "params_per_s": numel / statistics.median(t),
            }
            for n, t in times.items()
        ],
        "params_per_s": numel / statistics.median(ours),
        "ratio_vs_torch_fused": paired(find("fused=True")),
        "ratio_vs_torch_foreach": paired(find("foreach=True")),
        "ratio_vs_deepspeed": paired(find("deepspeed")),
        "ratio_note": "paired: median over rounds of the ratio within each round",
    }


def print_model_table(res: Dict) -> None:
    c = res["config"]
    print(
        f"zerostream bench optim --model {c['model']}: {c['optimizer']}, {c['tensors']} "
        f"tensors, {c['numel'] / 1e6:.1f}M fp32 params and grads, one step() over the "
        f"list, median of {c['repeats']}"
    )
    print(f"{'peer':34s} {'ms/step':>9s} {'Gparam/s':>9s}")
    for p in res["peers"]:
        print(f"{p['name']:34s} {p['ms_per_step']:9.1f} {p['params_per_s'] / 1e9:9.3f}")
    fmt = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
    print(
        f"ratios (median of per-round ratios): vs torch fused "
        f"{fmt(res['ratio_vs_torch_fused'])}; vs torch foreach "
        f"{fmt(res['ratio_vs_torch_foreach'])}; vs DeepSpeed {fmt(res['ratio_vs_deepspeed'])}"
    )

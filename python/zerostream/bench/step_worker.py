"""One peer of `zerostream bench step`, in its own process so that its peak RSS and peak device
memory are its own: `python -m zerostream.bench.step_worker '<json spec>'`. Prints one line
`ZS_BENCH_STEP <json>` with per-step times, phases, bytes moved and memory peaks."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Dict, List

import torch

from .memory import peak_rss_bytes, reset_peak

MARK = "ZS_BENCH_STEP "


def _registrations() -> Dict[str, int]:
    """What zerostream's host arenas asked the GPU to register and what it refused."""
    from ..offload.host_buffers import arena_totals

    totals = arena_totals()
    return {k: totals[k] for k in ("registrations", "registered", "register_failed")}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Engine:
    """The loop's three calls for an engine of DeepSpeed's API: `lib` is the zerostream or
    the deepspeed module."""

    def __init__(self, lib, module, cfg: dict):
        self.engine, *_ = lib.initialize(model=module, config=cfg)

    def step(self, x, y) -> torch.Tensor:
        loss = self.engine(x, y)
        self.engine.backward(loss)
        self.engine.step()
        return loss

    def telemetry(self) -> Dict[str, Dict[str, float]]:
        t = getattr(self.engine, "telemetry", None)
        return {} if t is None else t.snapshot()


class _Torch:
    """Plain PyTorch: the model in the run's dtype, fused AdamW with the resolved config's
    hyperparameters and gradient clipping."""

    def __init__(self, module, cfg):
        self.module = module
        self.clip = cfg.gradient_clipping
        self.opt = torch.optim.AdamW(
            module.parameters(),
            **cfg.optimizer.kwargs("lr", "betas", "eps", "weight_decay"),
            fused=True,
        )

    def step(self, x, y) -> torch.Tensor:
        loss = self.module(x, y)
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss

    def telemetry(self) -> dict:
        return {}


def _delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after}


def run(spec: dict) -> dict:
    from zerostream.bench.gpt import GPT, GPTShape, batches

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(spec["port"]),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
    )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = GPTShape(**spec["shape"])
    cfg = spec["config"]
    torch.manual_seed(spec["seed"])
    model = GPT(shape)
    peer = spec["peer"]
    if peer == "torch":
        from zerostream.config import load
        from zerostream.precision import DTYPES

        resolved = load(cfg, world_size=1, log=False)
        if resolved.optimizer is None or resolved.optimizer.name not in ("adam", "adamw"):
            return {
                "peer": peer,
                "skipped": "the torch peer runs AdamW; the config's optimizer is not Adam or AdamW",
            }
        runner = _Torch(model.to(device, DTYPES[resolved.precision]), resolved)
    elif peer == "deepspeed":
        from zerostream.bench import deepspeed_unavailable

        why = deepspeed_unavailable()  # the compatibility package would be zerostream again
        if why is not None:
            return {"peer": peer, "skipped": why}
        try:
            import deepspeed
        except ImportError as exc:
            return {"peer": peer, "skipped": f"deepspeed is not importable here ({exc})"}
        runner = _Engine(deepspeed, model, cfg)
    else:
        import zerostream

        runner = _Engine(zerostream, model, cfg)
    data = batches(shape, spec["micro_batch"], device, seed=spec["seed"])
    times: List[float] = []
    losses: List[float] = []
    before = {}
    for i in range(spec["warmup"] + spec["steps"]):
        if i == spec["warmup"]:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            before = runner.telemetry()
        x, y = next(data)
        _sync(device)
        start = time.perf_counter()
        loss = runner.step(x, y)
        _sync(device)
        if i >= spec["warmup"]:
            times.append(time.perf_counter() - start)
        losses.append(float(loss.detach().float()))
    after = runner.telemetry()
    phases = (
        {k: v / spec["steps"] for k, v in _delta(after["seconds"], before["seconds"]).items()}
        if after
        else {}
    )
    moved, link_seconds = (
        [
            {k: v / spec["steps"] for k, v in _delta(after[key], before[key]).items()}
            for key in ("bytes", "tier_seconds")
        ]
        if after
        else ({}, {})
    )
    arenas = _registrations() if peer == "zerostream" else {}
    return {
        "peer": peer,
        "device": str(device),
        # On a GPU the phases and the collectives' seconds are the host's issue time.
        "issue_timed": device.type == "cuda" and peer in ("zerostream", "serial-step"),
        "host_registration": arenas,
        "step_seconds": times,
        "losses": losses,
        "phase_seconds": phases,
        "bytes_per_step": moved,
        "tier_seconds": link_seconds,
        "peak_rss_bytes": peak_rss_bytes(),
        "peak_device_bytes": (
            torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        ),
    }


def main() -> int:
    reset_peak()  # ru_maxrss would carry the launching process's RSS (Note [A child's peak RSS])
    result = run(json.loads(sys.argv[1]))
    sys.stdout.flush()
    print(MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What zerostream's ZenFlow runs with: ZeRO stage 1 or 2, offload_optimizer device cpu
(whole: no ratio), a fixed update_interval, bf16 or fp32 weights, one micro-batch a step
(Note [ZenFlow's step] in optimizer.py). Everything else a zenflow section meets is refused
at initialize(), by key."""

from __future__ import annotations

from typing import List

_Z = "zero_optimization."


def zenflow_refusals(cfg) -> List[str]:
    """'<key path>: <what>' for each setting ZenFlow does not run with here."""
    z = cfg.zero_optimization
    zf = z.zenflow
    if zf is None:
        return []
    found = []
    if z.stage not in (1, 2):
        found.append(
            f"{_Z}zenflow: ZenFlow at ZeRO stage {z.stage} (zerostream runs it at stages 1 and 2)"
        )
    device = z.offload_optimizer_device
    if device != "cpu":
        found.append(
            f'{_Z}offload_optimizer.device="{device}" with {_Z}zenflow: ZenFlow updates the '
            'unselected columns on the host and needs offload_optimizer device "cpu" '
            "(DeepSpeed: ZenFlow must be used with cpu offload)"
        )
    elif z.offload_optimizer.ratio != 1.0:
        found.append(
            f"{_Z}offload_optimizer.ratio={z.offload_optimizer.ratio} with {_Z}zenflow: part "
            "of the optimizer state on the device"
        )
    if isinstance(zf.update_interval, str):
        found.append(
            f'{_Z}zenflow.update_interval="auto": the interval adapted from the gradients '
            "(with auto_ratio); give an integer"
        )
    if cfg.precision == "fp16":
        found.append(
            f"fp16.enabled with {_Z}zenflow: ZenFlow with fp16 loss scaling (use bf16 or fp32)"
        )
    gas = cfg.gradient_accumulation_steps
    if gas is not None and gas != 1:
        found.append(
            f"gradient_accumulation_steps={gas} with {_Z}zenflow: DeepSpeed replaces it by "
            "zenflow.update_interval (ZenFlow accumulates over that many steps itself); set it "
            "to 1"
        )
    return found

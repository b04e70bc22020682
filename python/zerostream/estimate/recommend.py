"""From the options' predictions to advice: why the offloads that are needed are needed (in
the numbers that force them), and the recommended option written as a ds_config.json that
zerostream's parser accepts."""

from __future__ import annotations

import json
import math
import textwrap
from typing import Dict, List, Optional, Sequence, Tuple

from .machine import Machine
from .model import ModelShape
from .plan import Prediction, Workload, optimizer_state_key
from .units import gb, seconds

Key = Tuple[int, str, str]


def _by_option(preds: List[Prediction]) -> Dict[Key, Prediction]:
    """The options without memory tiers, by (stage, optimizer, params)."""
    return {
        (p.option.stage, p.option.optimizer, p.option.param): p
        for p in preds
        if not (p.option.tiered or p.option.gpu_tier)
    }


def _fits_where(p: Prediction) -> str:
    return "fits" if p.fits else "does not fit: " + "; ".join(p.problems)


def explain(
    preds: List[Prediction],
    rec: Optional[Prediction],
    shape: ModelShape,
    work: Workload,
    machine: Machine,
) -> List[str]:
    """Lines saying which offloads are needed and why, from the predictions' numbers."""
    by = _by_option(preds)
    P, N, d = shape.params, machine.world, work.dtype_bytes
    dname = "fp32" if d == 4 else "16-bit"
    where = "per process" if machine.cpu_only else "per GPU"
    lines = []
    s2 = [p for p in preds if p.option.stage == 2]
    s2_fit = any(p.fits for p in s2)
    params = (
        f"{dname} params {gb(d * P)} GB: stage 2 keeps them whole {where} "
        f"(with stage 2 and no offload: {gb(by[(2, 'none', 'none')].device_peak)} GB {where}); "
        f"stage 3 shards them, {gb(d * P)} GB / {N} = {gb(d * P / N)} GB {where}"
    )
    if not s2_fit:
        params += " -> they fit only with stage 3"
        if not machine.cpu_only and d * P + machine.gpu_reserve > machine.gpu_mem:
            params += f" ({gb(d * P)} GB > {gb(machine.gpu_mem)} GB per GPU)"
    lines.append(params)
    opt, grads = work.state_bytes * P, work.master_bytes * P
    z3 = by[(3, "none", "none")]
    lines.append(
        f"optimizer states ({work.state_name.replace('master, ', 'master + ', 1)}: "
        f"{work.state_bytes} "
        f"B/param) {gb(opt)} GB and {'bf16' if work.bf16_master else 'fp32'} "
        f"gradients ({work.master_bytes} B/param) {gb(grads)} GB: "
        f"{'in the processes' if machine.cpu_only else 'on the GPUs'} (stage 3, no offload) "
        f"{gb((opt + grads) / N)} GB {where} -> {_fits_where(z3)}"
    )
    cpu = by[(3, "cpu", "none")]
    host_bytes = work.offloaded_grad_bytes
    host_grads = host_bytes * P
    host_what = f"{'16-bit' if host_bytes == 2 else 'fp32'} gradients"
    host_state = (opt + host_grads) * machine.gpus_per_node / N
    lines.append(
        f"in host RAM (offload_optimizer cpu, {host_what}): {gb(host_state)} GB of states "
        f"per node "
        f"+ {machine.gpus_per_node} x {gb(machine.host_overhead)} GB process overhead "
        f"= {gb(cpu.host_node)} GB vs {gb(machine.host_usable)} GB usable of "
        f"{gb(machine.cpu_mem)} GB -> "
        + ("fits" if cpu.host_node <= machine.host_usable else "does not fit, so NVMe")
    )
    nv = by[(3, "nvme", "none")]
    per_node = machine.gpus_per_node / N
    lines.append(
        f"on NVMe (offload_optimizer nvme): {gb(opt * per_node)} GB per node on disk (of "
        f"{gb(machine.nvme)} GB), the {host_what} {gb(host_grads * per_node)} GB stay in host "
        f"RAM: host {gb(nv.host_node)} GB -> {_fits_where(nv)}"
    )
    tiered = [
        p for p in preds if (p.option.tiered or p.option.gpu_tier) and p.option.param == "none"
    ]
    if tiered:
        t = tiered[0]
        kept = t.host.get(optimizer_state_key(work, in_cpu=True), 0)
        grads = t.device.get("device-tier grads", 0)
        on_gpu = sum(v for k, v in t.device.items() if k.startswith("device-tier")) - grads
        home = (
            f", with their gradients ({gb(grads)} GB)"
            if grads
            else ', their gradients landed in host RAM (zerostream.device_tier_grads "host")'
        )
        gpu = (
            f"the GPUs' spare memory keeps {gb(on_gpu)} GB of the optimizer state each{home} "
            f"(offload_optimizer.ratio {t.knobs.offload_ratio:.4f}: the first sub-groups are "
            f"stepped there)"
        )
        if t.option.optimizer == "cpu":  # the GPUs and the host hold it all: no disk
            lines.append(
                f"with memory tiers: {gpu}, and host RAM the rest (offload_optimizer cpu): host "
                f"{gb(t.host_node)} GB -> {_fits_where(t)}; no NVMe traffic instead of "
                f"{gb(nv.traffic['nvme_read'] + nv.traffic['nvme_write'])} GB per step"
            )
        else:
            lines.append(
                f'with memory tiers (zerostream.optimizer_max_in_cpu "auto"): '
                f"{gpu + ', and ' if on_gpu else ''}the host RAM that leaves free keeps "
                f"{gb(kept * machine.gpus_per_node)} GB of the optimizer state per node, "
                f"{gb(t.nvme_node)} GB stay on disk: host {gb(t.host_node)} GB -> "
                f"{_fits_where(t)}; NVMe traffic per step "
                f"{gb(t.traffic['nvme_read'] + t.traffic['nvme_write'])} GB instead of "
                f"{gb(nv.traffic['nvme_read'] + nv.traffic['nvme_write'])} GB"
            )
    if rec is None:
        lines.append(
            "no option fits: add GPUs or nodes (every per-GPU and per-node share shrinks), "
            "host RAM or NVMe, or shorten --seq / --micro-batch"
        )
        return lines
    o = rec.option
    built = machine.gpus_per_node * d * P
    if o.stage == 3 and built > machine.cpu_mem:
        lines.append(
            f"build the model under zero.Init (Hugging Face: from_pretrained with the DeepSpeed "
            f"config set): loaded whole by each of the {machine.gpus_per_node} processes it "
            f"would take {gb(built)} GB of host RAM per node first"
        )
    if o.stage == 3 and o.param != "none":
        keep = by[(3, o.optimizer, "none")]
        lines.append(
            f"params offloaded to {o.param}: keeping the shards on the GPUs "
            f"({o.label.replace('params ' + o.param, 'params none')}) "
            f"{_fits_where(keep)}"
        )
    elif o.stage == 3:
        lines.append(
            f"params stay on the GPUs: the stage-3 shard ({gb(d * math.ceil(P / N))} GB), the "
            f"gathered layers ({gb(rec.backward.get('gathered params', 0))} GB) and the "
            f"activations fit in {gb(machine.gpu_mem)} GB ({gb(rec.device_peak)} GB "
            f"+ {gb(machine.gpu_reserve)} GB reserve)"
            if not machine.cpu_only
            else "params stay in the process (no param offload needed)"
        )
    return lines


def time_note(rec: Prediction, work: Workload, others: bool = True) -> str:
    """What bounds the recommended option's step (and the other links' times) and the lever
    for it when the optimizer's once-per-step work bounds it."""
    s, t, m = rec.seconds, rec.traffic, rec.machine
    bound = rec.bound_by
    text = f"step >= {seconds(rec.step_seconds)} s, bound by {bound}"
    if bound == "nvme":
        text += (
            f" (read {gb(t['nvme_read'])} GB at {m.rate('nvme_read')} GB/s + write "
            f"{gb(t['nvme_write'])} GB at {m.rate('nvme_write')} GB/s per node)"
        )
    elif bound == "cpu_adam":
        text += f" ({t['cpu_adam'] / 1e9:.2f} G params at {m.rate('cpu_adam')} Gparam/s per node)"
    elif bound == "pcie":
        text += f" ({gb(max(t['h2d'], t['d2h']))} GB each way per GPU at {m.rate('pcie')} GB/s)"
    elif bound == "compute":
        text += f" ({t['flops'] / 1e12:.0f} TFLOP at {m.rate('peak_tflops')} TFLOP/s per GPU)"
    if others:
        text += "; other links: " + ", ".join(
            f"{k} {seconds(v)} s" for k, v in s.items() if k != bound
        )
    per_micro = s["compute"] / work.grad_accum
    per_step = max(
        s["cpu_adam"],
        t.get("optimizer_nvme_read", 0) / (m.rate("nvme_read") * 1e9)
        + t.get("optimizer_nvme_write", 0) / (m.rate("nvme_write") * 1e9),
    )
    if bound in ("nvme", "cpu_adam") and per_micro > 0 and per_step > s["compute"]:
        text += (
            f". The optimizer's {'NVMe traffic' if bound == 'nvme' else 'CPU step'} comes once "
            f"per step: with gradient_accumulation_steps >= "
            f"{math.ceil(per_step / per_micro)} (now {work.grad_accum}) the GPUs' compute, "
            f"{seconds(per_micro)} s per micro-batch, would take longer than it"
        )
    return text


def ds_config(rec: Prediction, shape: ModelShape, work: Workload, nvme_path: str) -> dict:
    """The recommended option as a ds_config (DeepSpeed's keys; zerostream's parser and
    DeepSpeed's both accept it). Batch keys from the workload; train_batch_size is left to
    the batch rule (micro x accumulation x world size)."""
    o, k = rec.option, rec.knobs
    zero: dict = {
        "stage": o.stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": k.reduce_bucket_size,
    }
    if o.stage == 3:
        zero.update(
            {
                "stage3_prefetch_bucket_size": k.prefetch_bucket_size,
                "stage3_param_persistence_threshold": k.persistence_threshold,
                "stage3_max_live_parameters": k.max_live_parameters,
                "stage3_max_reuse_distance": k.max_reuse_distance,
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
    else:
        zero["allgather_bucket_size"] = k.allgather_bucket_size
    cfg_ext: dict = {}  # the "zerostream" section
    if o.optimizer != "none":
        off = {"device": o.optimizer, "pin_memory": True}
        if o.optimizer == "nvme":
            zero["sub_group_size"] = k.sub_group_size
            if o.tiered:  # the run plans the host tier from its own free memory
                cfg_ext["optimizer_max_in_cpu"] = "auto"
            off.update(
                {
                    "nvme_path": nvme_path,
                    "buffer_count": k.optimizer_buffer_count,
                    "pipeline_read": True,
                    "pipeline_write": True,
                }
            )
        if k.offload_ratio < 1.0:  # the planner's GPU tier (Note [The device tier])
            off["ratio"] = round(k.offload_ratio, 6)
            zero["sub_group_size"] = k.sub_group_size  # the ratio counts these
            if k.device_tier_grads != "device":  # it found the host's landing faster
                cfg_ext["device_tier_grads"] = k.device_tier_grads
        zero["offload_optimizer"] = off
    if o.stage == 3 and o.param != "none":
        off = {"device": o.param, "pin_memory": True}
        if o.param == "nvme":
            off.update(
                {
                    "nvme_path": nvme_path,
                    "buffer_count": k.param_buffer_count,
                    "buffer_size": k.param_buffer_size,
                    "max_in_cpu": "auto" if o.tiered else k.max_in_cpu,
                }
            )
        zero["offload_param"] = off
    cfg: dict = {
        "train_micro_batch_size_per_gpu": work.micro_batch,
        "gradient_accumulation_steps": work.grad_accum,
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
    }
    if work.precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif work.precision == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}
    cfg["zero_optimization"] = zero
    if cfg_ext:
        cfg["zerostream"] = cfg_ext
    if "nvme" in (o.optimizer, o.param):
        cfg["aio"] = {
            "block_size": 1048576,
            "queue_depth": 32,
            "intra_op_parallelism": 1,
            "single_submit": False,
            "overlap_events": True,
        }
    return cfg


def _inline(value) -> str:
    return json.dumps(value, separators=(", ", ": "))


def format_config(cfg: dict, comment: Sequence[str] = (), width: int = 100) -> str:
    """JSON in the style of configs/: one key per line, small all-scalar objects on one
    line. `comment` lines go first as // lines (hjson, which DeepSpeed and zerostream read;
    plain json.load, as Hugging Face's HfDeepSpeedConfig uses, does not), wrapped."""

    def block(obj: dict, indent: int) -> List[str]:
        pad = " " * (indent + 2)
        lines = []
        for i, (k, v) in enumerate(obj.items()):
            comma = "," if i < len(obj) - 1 else ""
            text = f"{pad}{json.dumps(k)}: {_inline(v)}{comma}"
            if isinstance(v, dict) and len(text) > width:
                lines.append(f"{pad}{json.dumps(k)}: {{")
                lines += block(v, indent + 2)
                lines.append(f"{pad}}}{comma}")
            else:
                lines.append(text)
        return lines

    out = []
    for line in comment:
        out += textwrap.wrap(line, width - 3, initial_indent="// ", subsequent_indent="//   ")
    return "\n".join(out + ["{"] + block(cfg, 0) + ["}"]) + "\n"

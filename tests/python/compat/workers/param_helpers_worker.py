"""One rank of test_param_helpers.py: trains a small model with `deepspeed.initialize` from the
installed compatibility package under several ZeRO configs and records what DeepSpeed's
param helpers (`deepspeed.utils.safe_*`) return and what setting through them does. The
test compares the records with a plain single-process torch.optim.AdamW run (`reference`)."""

from __future__ import annotations

import sys

import torch

LR, WD, STEPS = 1e-2, 0.01, 3
GLOBAL_BATCH = 8


def make_model() -> torch.nn.Module:
    """Odd sizes: at stages 1/2 the first weight straddles the two ranks' partitions; at
    stage 3 its shards and the last bias's are padded. The first bias is frozen."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    model[0].bias.requires_grad_(False)
    return model


def batch(step: int):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(GLOBAL_BATCH, 5, generator=g), torch.randn(GLOBAL_BATCH, 3, generator=g)


def modified(name: str, kind: str, value: torch.Tensor) -> torch.Tensor:
    """The value the test sets after STEPS steps (every rank, and the reference, alike)."""
    if kind == "param":
        return value * 0.5 + 0.125
    if kind == "exp_avg":
        return -value
    if kind == "exp_avg_sq":
        return value * 2.0
    return value * 3.0  # the gradient


def config(stage: int, offload: str, nvme: str) -> dict:
    zero = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0  # every param stays partitioned
    if offload != "none":
        zero["offload_optimizer"] = {"device": offload}
    if offload == "nvme":
        zero["offload_optimizer"]["nvme_path"] = nvme
    if stage == 3 and offload == "nvme":
        zero["offload_param"] = {"device": "nvme", "nvme_path": nvme, "max_in_cpu": 0}
    return {
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // 2,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}},
        "zero_optimization": zero,
    }


def trainable(model):
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def scenario(deepspeed, rank, stage, offload, nvme, optimizer_backward):
    from deepspeed.utils import (
        safe_get_full_fp32_param,
        safe_get_full_grad,
        safe_get_full_optimizer_state,
        safe_set_full_fp32_param,
        safe_set_full_grad,
        safe_set_full_optimizer_state,
        safe_update_full_grad_vectorized,
    )

    model = make_model()
    engine, opt, _, _ = deepspeed.initialize(model=model, config=config(stage, offload, nvme))
    rows = slice(rank * GLOBAL_BATCH // 2, (rank + 1) * GLOBAL_BATCH // 2)
    out = {"grad_before_backward": safe_get_full_grad(model[2].weight)}
    try:
        safe_get_full_optimizer_state(model[2].weight, "exp_avg")
        out["state_before_step"] = "no error"
    except ValueError as exc:
        out["state_before_step"] = str(exc)

    def backward(step):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(engine(x[rows]), y[rows])
        if optimizer_backward:
            opt.backward(loss)  # DeepSpeed's optimizer.backward (GAS is 1 here)
        else:
            engine.backward(loss)

    for step in range(STEPS):
        backward(step)
        engine.step()
    out["fp32"] = {n: safe_get_full_fp32_param(p) for n, p in trainable(model)}
    for kind in ("exp_avg", "exp_avg_sq"):
        out[kind] = {n: safe_get_full_optimizer_state(p, kind) for n, p in trainable(model)}
    out["frozen"] = (
        safe_get_full_fp32_param(model[0].bias),
        safe_get_full_optimizer_state(model[0].bias, "exp_avg"),
        safe_get_full_grad(model[0].bias),
    )
    if stage == 3:
        out["stage3"] = stage3_facts(deepspeed, model, opt, rank)

    backward(STEPS)
    out["grad"] = {n: safe_get_full_grad(p) for n, p in trainable(model)}
    if stage == 3:
        out["local_grad"] = local_grads(deepspeed, model, out["grad"], rank)
    # Set everything through the helpers between backward and step, then step once: the
    # gradients of the first param through safe_set_full_grad, the others through
    # safe_update_full_grad_vectorized (which hands update_func the current whole gradient).
    names = {id(p): n for n, p in trainable(model)}
    for i, (n, p) in enumerate(trainable(model)):
        safe_set_full_fp32_param(p, modified(n, "param", out["fp32"][n]))
        for kind in ("exp_avg", "exp_avg_sq"):
            safe_set_full_optimizer_state(p, modified(n, kind, out[kind][n]), kind)
        if i == 0:
            safe_set_full_grad(p, modified(n, "grad", out["grad"][n]))
    seen = []

    def update(grad, p):
        seen.append(torch.equal(grad, out["grad"][names[id(p)]]))
        return modified(names[id(p)], "grad", grad)

    safe_update_full_grad_vectorized([p for _, p in trainable(model)[1:]] + [model[0].bias], update)
    out["vectorized_saw_current_grads"] = seen
    out["read_back"] = {
        n: (
            safe_get_full_fp32_param(p),
            safe_get_full_optimizer_state(p, "exp_avg"),
            safe_get_full_optimizer_state(p, "exp_avg_sq"),
            safe_get_full_grad(p),
        )
        for n, p in trainable(model)
    }
    engine.step()
    out["grad_after_step"] = [safe_get_full_grad(p) for _, p in trainable(model)]
    out["final"] = {n: safe_get_full_fp32_param(p) for n, p in trainable(model)}
    out["final_weights"] = weights(deepspeed, model, stage)
    engine.destroy()
    return out


def weights(deepspeed, model, stage):
    """The model's own (16-bit path) weights, gathered at stage 3."""
    params = [p for _, p in trainable(model)]
    with deepspeed.zero.GatheredParameters(params, enabled=stage == 3):
        return {n: p.detach().clone() for n, p in trainable(model)}


def stage3_facts(deepspeed, model, opt, rank):
    """ZeRO-3: params stay partitioned while the helpers return them whole; the local
    helpers see this rank's padded shard; fp16_groups lists the params per group."""
    from deepspeed.utils import (
        safe_get_full_fp32_param,
        safe_get_local_fp32_param,
        safe_get_local_optimizer_state,
        safe_set_local_fp32_param,
        safe_set_local_optimizer_state,
    )

    w = model[0].weight
    facts = {
        "numel": [p.numel() for _, p in trainable(model)],
        "ds_tensor_numel": [p.ds_tensor.numel() for _, p in trainable(model)],
        "full_shapes": [tuple(safe_get_full_fp32_param(p).shape) for _, p in trainable(model)],
        "fp16_groups": [[id(p) for p in g] for g in opt.fp16_groups],
        "trainable_ids": [id(p) for _, p in trainable(model)],
    }
    full = safe_get_full_fp32_param(w).reshape(-1)
    k = -(-w.ds_numel // 2)
    local = safe_get_local_fp32_param(w)
    facts["local_fp32"] = (local, full[rank * k : (rank + 1) * k])
    exp_avg = safe_get_local_optimizer_state(w, "exp_avg")
    # A local set that writes back what was read changes nothing; one that writes a new
    # shard is what the full getter then assembles.
    safe_set_local_optimizer_state(w, exp_avg.clone(), "exp_avg")
    safe_set_local_fp32_param(w, local + 1.0)
    facts["after_local_set"] = safe_get_full_fp32_param(w).reshape(-1)
    safe_set_local_fp32_param(w, local)
    facts["restored"] = torch.equal(safe_get_full_fp32_param(w).reshape(-1), full)
    try:
        safe_set_local_fp32_param(w, torch.zeros(k + 1))
        facts["bad_numel"] = "no error"
    except ValueError as exc:
        facts["bad_numel"] = str(exc)
    return facts


def local_grads(deepspeed, model, full, rank):
    from deepspeed.utils import safe_get_local_grad

    out = {}
    for n, p in trainable(model):
        k = -(-p.ds_numel // 2)  # the shard, padded (ds_tensor is empty when it is on NVMe)
        padded = torch.zeros(2 * k)
        padded[: full[n].numel()] = full[n].reshape(-1)
        out[n] = (safe_get_local_grad(p), padded[rank * k : (rank + 1) * k])
    return out


def not_zero3(deepspeed):
    """The local helpers refuse a parameter that is not ZeRO-3 partitioned."""
    from deepspeed.utils import safe_get_local_fp32_param

    model = make_model()
    deepspeed.initialize(model=model, config=config(2, "none", ""))
    try:
        safe_get_local_fp32_param(model[2].weight)
    except ValueError as exc:
        return str(exc)
    return "no error"


def bf16_stage3(deepspeed):
    """bf16 weights at stage 3: the helper returns the fp32 master, which the model's bf16
    weights are the rounding of after a step (and which keeps digits they lack)."""
    from deepspeed.utils import safe_get_full_fp32_param

    model = make_model()
    cfg = config(3, "cpu", "")
    cfg["bf16"] = {"enabled": True}
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
    for step in range(2):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(engine(x.bfloat16()).float(), y)
        engine.backward(loss)
        engine.step()
    masters = {n: safe_get_full_fp32_param(p) for n, p in trainable(model)}
    bf16 = weights(deepspeed, model, 3)
    engine.destroy()
    return {
        "dtypes": sorted({str(m.dtype) for m in masters.values()}),
        "weights_are_rounded_masters": all(
            torch.equal(bf16[n], m.to(torch.bfloat16)) for n, m in masters.items()
        ),
        "masters_have_more_digits": any(
            not torch.equal(bf16[n].float(), m) for n, m in masters.items()
        ),
    }


def optimizer_backward_and_accumulation(deepspeed, rank):
    """DeepSpeed's optimizer.backward(loss) scales by the loss scale only: with 2
    accumulation steps, optimizer.backward(loss / 2) trains like engine.backward(loss)."""
    finals = []
    for use_optimizer in (False, True):
        model = make_model()
        cfg = config(2, "none", "")
        cfg["gradient_accumulation_steps"] = 2
        engine, opt, _, _ = deepspeed.initialize(model=model, config=cfg)
        for micro in range(4):
            x, y = batch(micro)
            rows = slice(rank * 4, rank * 4 + 4)
            loss = torch.nn.functional.mse_loss(engine(x[rows]), y[rows])
            if use_optimizer:
                opt.backward(loss / 2)
            else:
                engine.backward(loss)
            engine.step()
        finals.append([p.detach().clone() for _, p in trainable(model)])
        engine.destroy()
    return len(finals[0]) == len(finals[1]) and all(map(torch.equal, *finals))


def worker(rank, world, site, nvme, scenarios):
    sys.path.insert(0, site)  # the installed compatibility package (conftest.compat_site)
    import deepspeed

    results = {}
    for name, (stage, offload, optimizer_backward) in scenarios.items():
        path = f"{nvme}/{name}"
        results[name] = scenario(deepspeed, rank, stage, offload, path, optimizer_backward)
    results["not_zero3"] = not_zero3(deepspeed)
    results["bf16_stage3"] = bf16_stage3(deepspeed)
    results["optimizer_backward_gas"] = optimizer_backward_and_accumulation(deepspeed, rank)
    return results


def reference() -> dict:
    """The same run in one process with torch.optim.AdamW on the whole batch."""
    model = make_model()
    params = trainable(model)
    opt = torch.optim.AdamW([p for _, p in params], lr=LR, weight_decay=WD)

    def backward(step):
        x, y = batch(step)
        torch.nn.functional.mse_loss(model(x), y).backward()

    for step in range(STEPS):
        backward(step)
        opt.step()
        opt.zero_grad()
    out = {"fp32": {n: p.detach().clone() for n, p in params}}
    for kind in ("exp_avg", "exp_avg_sq"):
        out[kind] = {n: opt.state[p][kind].clone() for n, p in params}
    backward(STEPS)
    out["grad"] = {n: p.grad.clone() for n, p in params}
    with torch.no_grad():
        for n, p in params:
            p.copy_(modified(n, "param", p))
            for kind in ("exp_avg", "exp_avg_sq"):
                opt.state[p][kind].copy_(modified(n, kind, opt.state[p][kind]))
            p.grad.copy_(modified(n, "grad", p.grad))
    opt.step()
    out["final"] = {n: p.detach().clone() for n, p in params}
    return out

"""offload_optimizer.ratio at ZeRO stage 3: the first 1 - ratio of a rank's optimizer
sub-groups stay on the device and are stepped there (Note [The device tier],
offload/device_tier.py).

- The placement: DeepSpeed's int((1 - ratio) * n) sub-groups, the first in step order.
- The update: the device rule equals the CPU kernel and torch.optim.Adam/AdamW to fp32
  rounding, for fp32 and bf16 states.
- The mechanism: device sub-groups hold their state on the engine's device, outside the host
  arena, with no extent in the swap files and no disk traffic; with "cpu" there is no swap
  store at all. All three tiers in one run.
- Their gradients land on the device and never cross; the parameter accessors
  (safe_get/set_full_grad, safe_get/set_local_grad) read and write them there, also for a
  parameter whose shard straddles the device tier's boundary.
- The math: plain PyTorch AdamW's losses (2 ranks); a checkpoint saved with a ratio resumes
  into an all-NVMe run, and back, with the losses of an uninterrupted run.
"""

import pytest
import torch

from multirank import run_ranks
from tiny_gpt import TinyGPT, adamw_ds_config, make_batches, plain_adamw_losses
from zerostream.offload import sinks
from zerostream.offload.device_tier import device_count
from zerostream.offload.placement import DEVICE, HOST, NVME

STEPS, GLOBAL_BATCH, SUB_GROUP = 4, 8, 2000
LR, BETAS, WD, CLIP = 1e-2, (0.9, 0.95), 0.01, 0.5


# --- placement and the update --------------------------------------------------------------------
def test_the_first_one_minus_ratio_sub_groups_go_to_the_device_as_in_deepspeed():
    # DeepSpeed (stage3.py): sub-group i is on the device when i < int((1 - ratio) * n).
    assert device_count(10, 0.3) == 7
    assert device_count(4, 0.5) == 2
    assert device_count(3, 0.5) == 1  # int(1.5)
    assert device_count(1, 0.5) == 0  # one sub-group: all offloaded, as DeepSpeed does
    assert device_count(10, 0.9) == 0  # int(0.9999999999999998): DeepSpeed's rounding too
    assert device_count(5, 0.0) == 5 and device_count(5, 1.0) == 0


@pytest.mark.parametrize("adamw", [True, False])
@pytest.mark.parametrize(
    "master,states",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float32),
    ],
)
def test_the_device_update_is_the_cpu_kernel_s_and_torch_s(adamw, master, states):
    from zerostream.ops.adam import cpu_adam_step
    from zerostream.ops.device_adam import device_adam_step

    torch.manual_seed(0)
    n = 3000
    p0 = torch.randn(n)
    grads = [torch.randn(n) for _ in range(3)]

    def state():
        return [p0.to(master).clone(), torch.zeros(n, dtype=states), torch.zeros(n, dtype=states)]

    dev, cpu = state(), state()
    ref = torch.nn.Parameter(p0.clone())
    opt = (torch.optim.AdamW if adamw else torch.optim.Adam)(
        [ref], lr=LR, betas=BETAS, weight_decay=0.1
    )
    hyper = dict(lr=LR, betas=BETAS, weight_decay=0.1, adamw_mode=adamw, grad_scale=0.5)
    for step, g in enumerate(grads, start=1):
        device_adam_step(dev[0], g, dev[1], dev[2], step=step, **hyper)
        cpu_adam_step(cpu[0], g, cpu[1], cpu[2], step=step, **hyper)
        ref.grad = g * 0.5
        opt.step()
    for a, b in zip(dev, cpu):
        assert a.dtype == b.dtype
        if a.dtype == torch.float32:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        else:  # bf16: the same fp32 value rounded, or one rounding step apart
            assert ((a.float() - b.float()).abs() <= b.float().abs() * 2**-7 + 1e-30).all()
    if master == torch.float32:
        torch.testing.assert_close(dev[0], ref.detach(), rtol=1e-6, atol=1e-6)
    assert not torch.equal(dev[0].float(), p0)  # it moved


# --- the engine ----------------------------------------------------------------------------------
def _config(
    micro, nvme, device="cpu", ratio=0.5, max_in_cpu=0, params="none", grads="device", on_device=0
):
    offload = {"device": device, "ratio": ratio}
    if device == "nvme":
        offload["nvme_path"] = nvme
    zero = {
        "stage": 3,
        "reduce_bucket_size": 3000,
        "sub_group_size": SUB_GROUP,
        "stage3_param_persistence_threshold": 0,
        "offload_optimizer": offload,
    }
    if params != "none":  # the device tier's updated weights go down to host or NVMe shards
        zero["offload_param"] = {"device": params, "nvme_path": f"{nvme}/params"}
    ext = {"zerostream": {"optimizer_max_in_cpu": max_in_cpu, "device_tier_grads": grads}}
    if on_device:  # zerostream.optimizer_max_on_device (test_device_auto.py)
        ext["zerostream"]["optimizer_max_on_device"] = on_device
    return adamw_ds_config(micro, zero, LR, BETAS, WD, CLIP, **ext)


def _train(engine, rank, world, steps, first=0):
    import torch.distributed as dist

    micro = GLOBAL_BATCH // world
    xs, ys = make_batches(first + steps, GLOBAL_BATCH)
    losses, traffic, h2d = [], [], []
    swapper, stage = engine.optimizer.swapper, engine.optimizer.copy_stage
    for s in range(first, first + steps):
        before = (swapper.bytes_read, swapper.bytes_written, stage.stats["h2d_bytes"])
        before += (stage.stats["d2h_bytes"],)
        loss = engine(
            xs[s][rank * micro : (rank + 1) * micro], ys[s][rank * micro : (rank + 1) * micro]
        )
        engine.backward(loss)
        engine.step()
        traffic.append((swapper.bytes_read - before[0], swapper.bytes_written - before[1]))
        h2d.append((stage.stats["h2d_bytes"] - before[2], stage.stats["d2h_bytes"] - before[3]))
        total = loss.detach().float().clone()
        dist.all_reduce(total)
        losses.append(float(total) / world)
    return losses, traffic, h2d


def _device_grads(engine):
    """After a backward: whether the device tier's gradient buffers are on the engine's
    device, their elements, and how many elements the host gradient partitions hold less
    than the partitions (the device tier's prefix, when its gradients land there)."""
    x, y = make_batches(1, GLOBAL_BATCH)
    engine.backward(engine(x[0][:2], y[0][:2]))
    opt = engine.optimizer
    parts = opt.swapper.device_tier.grad_parts
    on_device = all(p.device == engine.device and bool(p.ne(0).any()) for p in parts.values())
    missing = sum(sinks.numel(p) for p in opt.flat16) - sum(g.numel() for g in opt.grads)
    opt.zero_grad()
    return on_device, sum(p.numel() for p in parts.values()), missing


def tiers_worker(rank, world, root):
    import zerostream

    micro = GLOBAL_BATCH // world
    out = {}
    runs = {
        "cpu": dict(device="cpu", ratio=0.5),
        "all": dict(device="cpu", ratio=0.0),
        "three": dict(device="nvme", ratio=0.5, max_in_cpu=2000),
        "params_nvme": dict(device="cpu", ratio=0.5, params="nvme"),
        "host_grads": dict(device="cpu", ratio=0.5, grads="host"),
    }
    for name, kw in runs.items():
        torch.manual_seed(0)
        engine, *_ = zerostream.initialize(
            model=TinyGPT(), config=_config(micro, f"{root}/{name}", **kw)
        )
        losses, traffic, h2d = _train(engine, rank, world, STEPS)
        swapper = engine.optimizer.swapper
        stats = swapper.stats()
        dev = [s for s in swapper.sub_groups if s.dev is not None]
        out[name] = {
            "losses": losses,
            "traffic": traffic,
            "h2d": h2d,
            "sub_groups": stats["sub_groups"],
            "elements": {k: stats[f"{k}_elements"] for k in ("device", "host", "nvme")},
            "store": stats["store"],
            "dev_on_engine_device": all(t.device == engine.device for s in dev for t in s.dev),
            # The host arena holds the host tier's tensors and nothing else.
            "arena_in_use": swapper.host_arena.stats()["in_use"] if swapper.host_arena else 0,
            "host_tier_bytes": sum(swapper._host_bytes(s) for s in swapper.sub_groups if s.on_host),
            "grad_bytes": engine.optimizer.grads[0].element_size(),
            "device_grads": _device_grads(engine),
            "state_kinds": sorted(
                k
                for k in engine.optimizer.offloadable_states()
                if engine.optimizer.offloadable_states()[k].tensors
            ),
        }
        engine.destroy()
    return out


def test_device_sub_groups_hold_their_state_on_the_device_and_train_as_pytorch(tmp_path):
    ranks = run_ranks(tiers_worker, 2, str(tmp_path))
    reference = plain_adamw_losses(STEPS, GLOBAL_BATCH, LR, BETAS, WD, CLIP)
    for out in ranks:
        for name, run in out.items():
            kinds = [s["tier"] for s in run["sub_groups"]]
            n = len(kinds)
            ratio = 0.0 if name == "all" else 0.5
            # The first int((1 - ratio) * n) sub-groups, and only they, are on the device.
            assert kinds[: device_count(n, ratio)] == [DEVICE] * device_count(n, ratio), kinds
            assert DEVICE not in kinds[device_count(n, ratio) :], kinds
            assert n >= 2 and DEVICE in kinds, kinds
            dev = sum(s["end"] - s["begin"] for s in run["sub_groups"] if s["tier"] == DEVICE)
            assert run["elements"]["device"] == dev
            # Their tensors are the engine device's, outside the host and staging arenas.
            assert run["dev_on_engine_device"]
            assert run["arena_in_use"] == run["host_tier_bytes"]
            # offload_states sees them (hp_params and optim_states of the device tier).
            assert {"hp_params", "optim_states"} <= set(run["state_kinds"]), run["state_kinds"]
            # No disk byte for device (or host) sub-groups: only NVMe ones have extents and
            # traffic, 12 bytes an element each way.
            for s in run["sub_groups"]:
                assert ("param" in s) == (s["tier"] == NVME), s
            assert run["traffic"] == [(12 * run["elements"]["nvme"],) * 2] * STEPS
            # Every step the copy stage carried the other sub-groups' gradients down and
            # their updated weights (fp32 here) up; the device tier's gradients landed on the
            # device (its buffers there, and no host memory for them: the host partitions
            # hold only the rest) and neither they nor its weights crossed.
            total = sum(run["elements"].values())
            step_h2d = 0 if name == "params_nvme" else 4 * (total - dev)  # params_nvme: to disk
            step_d2h = run["grad_bytes"] * (total - dev)
            on_device, grad_elements, host_short_by = run["device_grads"]
            if name == "host_grads":  # zerostream.device_tier_grads "host": down and back up
                step_h2d += run["grad_bytes"] * dev
                step_d2h += run["grad_bytes"] * dev
                assert grad_elements == 0 and host_short_by == 0
            else:
                assert on_device and grad_elements == dev and host_short_by == dev
            assert run["h2d"] == [(step_h2d, step_d2h)] * STEPS, (run["h2d"], step_h2d, step_d2h)
            assert run["losses"] == pytest.approx(reference, rel=1e-5), name
        assert out["cpu"]["store"] is None and out["all"]["store"] is None  # no swap files
        assert set(s["tier"] for s in out["all"]["sub_groups"]) == {DEVICE}
        three = [s["tier"] for s in out["three"]["sub_groups"]]
        assert {DEVICE, HOST, NVME} <= set(three), three
        assert out["three"]["elements"]["host"] <= 2000


def resume_worker(rank, world, root):
    import zerostream

    micro = GLOBAL_BATCH // world
    out = {}

    def engine_for(name, ratio):
        torch.manual_seed(0)
        cfg = _config(micro, f"{root}/{name}", device="nvme", ratio=ratio)
        return zerostream.initialize(model=TinyGPT(), config=cfg)[0]

    engine = engine_for("whole", 0.5)
    out["whole"] = _train(engine, rank, world, STEPS)[0]
    engine.destroy()
    for saved, loaded in ((0.5, 1.0), (1.0, 0.5)):
        engine = engine_for(f"save{saved}", saved)
        _train(engine, rank, world, 2)
        engine.save_checkpoint(f"{root}/ckpt{saved}", tag="half")
        engine.destroy()
        engine = engine_for(f"load{loaded}", loaded)
        engine.load_checkpoint(f"{root}/ckpt{saved}", tag="half")
        out[(saved, loaded)] = _train(engine, rank, world, STEPS - 2, first=2)[0]
        out[("device", loaded)] = engine.optimizer.swapper.stats()["device_elements"]
        engine.destroy()
    return out


def test_a_checkpoint_saved_with_a_ratio_resumes_all_on_nvme_and_back(tmp_path):
    for out in run_ranks(resume_worker, 2, str(tmp_path)):
        assert out[("device", 1.0)] == 0 and out[("device", 0.5)] > 0
        for key in ((0.5, 1.0), (1.0, 0.5)):
            # The device rule and the CPU kernel agree to fp32 rounding, not bit for bit.
            assert out[key] == pytest.approx(out["whole"][2:], rel=1e-6), key


def refused_worker(rank, world, root):
    import zerostream

    cfg = _config(8, root, ratio=0.5)
    cfg["optimizer"] = {"type": "Adagrad", "params": {"lr": 0.01}}
    try:
        zerostream.initialize(model=TinyGPT(), config=cfg)
    except NotImplementedError as exc:
        return str(exc)
    return None


def test_a_non_adam_optimizer_with_a_ratio_is_refused_by_name(tmp_path):
    message = run_ranks(refused_worker, 1, str(tmp_path))[0]
    assert message is not None and "zero_optimization.offload_optimizer.ratio 0.5" in message


def parked_worker(rank, world, root):
    """offload_states between two steps parks the device tier's masters and moments (it is
    device state) and reload_states brings them back: the run ends bitwise where an
    uninterrupted one ends."""
    import zerostream
    from zerostream.zero import state_offload

    state_offload._COPY_HOST_TENSORS = True  # a CPU run: copy what a GPU would move
    micro = GLOBAL_BATCH // world
    out = {}
    for parked in (False, True):
        torch.manual_seed(0)
        engine, *_ = zerostream.initialize(model=TinyGPT(), config=_config(micro, root))
        _train(engine, rank, world, 2)
        if parked:
            dev = [t for s in engine.optimizer.swapper.sub_groups if s.dev for t in s.dev]
            before = [t.data_ptr() for t in dev]
            engine.offload_states()
            out["moved"] = all(t.data_ptr() != p for t, p in zip(dev, before))
            engine.reload_states()
        out[parked] = _train(engine, rank, world, 2, first=2)[0]
        engine.destroy()
    return out


def test_offload_states_parks_the_device_tier_and_training_goes_on_bitwise(tmp_path):
    for out in run_ranks(parked_worker, 2, str(tmp_path)):
        assert out["moved"]
        assert out[True] == out[False]


def access_worker(rank, world, root):
    """One backward, then DeepSpeed's gradient accessors, with a ratio and without one."""
    import zerostream
    from zerostream.utils import (
        safe_get_full_grad,
        safe_get_local_grad,
        safe_set_full_grad,
        safe_set_local_grad,
    )
    from zerostream.zero import GatheredParameters

    micro = GLOBAL_BATCH // world
    xs, ys = make_batches(2, GLOBAL_BATCH)
    out = {}
    for ratio in (0.5, 1.0):
        torch.manual_seed(0)
        cfg = _config(micro, f"{root}/{ratio}", ratio=ratio)
        engine = zerostream.initialize(model=TinyGPT(), config=cfg)[0]
        opt = engine.optimizer
        straddling = 0
        if ratio < 1.0:
            parts = opt.swapper.device_tier.grad_parts
            for zp_id, (g, at) in opt.slots.items():
                d = parts[g].numel() if g in parts else 0
                n = next(zp.shard_numel for zps in opt.groups for zp in zps if zp.ds_id == zp_id)
                straddling += at < d < at + n
        lo, hi = rank * micro, (rank + 1) * micro
        engine.backward(engine(xs[0][lo:hi], ys[0][lo:hi]))
        params = [p for p in engine.module.parameters() if p.requires_grad]
        full = [safe_get_full_grad(p) for p in params]
        local = [safe_get_local_grad(p) for p in params]
        for p, g in zip(params, full):
            safe_set_full_grad(p, g * 0.5)
        halved = [safe_get_local_grad(p) for p in params]
        safe_set_local_grad(params[0], local[0] * 0.25)
        quarter = safe_get_local_grad(params[0])
        engine.step()
        with GatheredParameters(params):
            after = [p.detach().float().clone() for p in params]
        out[ratio] = (full, local, halved, quarter, after, straddling)
        engine.destroy()
    return out


def test_the_gradient_accessors_read_and_write_the_device_tier_s_gradients(tmp_path):
    for out in run_ranks(access_worker, 2, str(tmp_path)):
        full, local, halved, quarter, after, straddling = out[0.5]
        assert straddling >= 1  # a shard across the boundary: read and written on both sides
        want = out[1.0]  # every gradient in the host partitions
        assert all(torch.equal(a, b) for a, b in zip(full, want[0]))
        assert all(torch.equal(a, b) for a, b in zip(local, want[1]))
        assert all(torch.equal(a, b * 0.5) for a, b in zip(halved, local))
        assert torch.equal(quarter, local[0] * 0.25) and torch.equal(quarter, want[3])
        for a, b in zip(after, want[4]):  # the halved gradients stepped: device rule vs kernel
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

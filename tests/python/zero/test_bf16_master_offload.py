"""bf16.bf16_master_weights_and_grads with an offloaded optimizer (Note [16-bit master
weights with an offloaded optimizer] in zero/master_precision.py), at ZeRO stages 1-3 on 2
Gloo ranks, offload_optimizer "cpu" and "nvme", with bf16 or fp32 moments.

- The math: plain PyTorch AdamW stepping a bf16 model's own parameters on the whole batch,
  within bf16 rounding (the 2e-2 of the other bf16 parity tests); and the run must differ
  from the fp32-master run (the key changed the math). The kernel's rounding itself is
  checked bit for bit against an fp32 update in tests/cpp/optim/test_half_layouts.cpp.
- The mechanism: the masters are bf16 in host memory, 1/world of the model, with no fp32
  copy anywhere; gradients land bf16; the moments have the configured dtype; with "nvme" the
  bytes the swap store moves per step are 2 + 2 x (2 or 4) per element, not 12.
- A checkpoint resumes bitwise, also across "cpu" and "nvme".
"""

import pytest
import torch

from multirank import run_ranks
from tiny_gpt import TinyGPT, adamw_ds_config, plain_adamw_losses, train_data_parallel

STEPS, GLOBAL_BATCH = 4, 16
LR, BETAS, WD, CLIP = 1e-2, (0.9, 0.95), 0.01, 0.5


def _config(micro, stage, device, root, master=True, bf16_states=True):
    bf16 = {"enabled": True}
    if master:
        bf16.update(bf16_master_weights_and_grads=True, bf16_optimizer_states=bf16_states)
    offload = {"device": device}
    if device == "nvme":
        offload.update(nvme_path=f"{root}/swap", buffer_count=4)
    zero = {
        "stage": stage,
        "reduce_bucket_size": 3000,
        "offload_optimizer": offload,
        "sub_group_size": 20000,
    }
    return adamw_ds_config(micro, zero, LR, BETAS, WD, CLIP, bf16=bf16)


def _train(engine, rank, world, steps, first=0):
    return train_data_parallel(engine, rank, world, steps, GLOBAL_BATCH, first)


def _state_of(opt):
    """dtypes and per-element bytes of the optimizer state this rank holds."""
    if opt.swapper is not None:
        sw = opt.swapper
        return {
            "kinds": {k: str(d) for k, d in sw.dtypes.items()},
            "moved_per_step": None,
        }
    state = [opt.optimizer.state[m] for m in opt.masters]
    return {
        "kinds": {
            k: str(v.dtype) for st in state for k, v in st.items() if torch.is_tensor(v) and v.dim()
        },
        "masters": {str(m.dtype) for m in opt.masters},
        "master_device": {m.device.type for m in opt.masters},
    }


def worker(rank, world, cases, root):
    import zerostream

    micro = GLOBAL_BATCH // world
    out = {}
    for stage, device, bf16_states in cases:
        for master in (True, False):
            torch.manual_seed(0)
            cfg = _config(
                micro, stage, device, f"{root}/{stage}{device}{master}", master, bf16_states
            )
            engine = zerostream.initialize(model=TinyGPT(), config=cfg)[0]
            opt = engine.optimizer
            losses = _train(engine, rank, world, 1)
            moved = None
            if opt.swapper is not None:
                before = opt.swapper.bytes_read + opt.swapper.bytes_written
            losses += _train(engine, rank, world, STEPS - 1, first=1)
            if opt.swapper is not None:
                moved = (opt.swapper.bytes_read + opt.swapper.bytes_written - before) / (STEPS - 1)
            out[(stage, device, bf16_states, master)] = {
                "losses": losses,
                "state": _state_of(opt),
                "grad_dtypes": {str(g.dtype) for g in opt.grads},
                "partition_numel": sum(g.numel() for g in opt.grads),
                "model_numel": sum(
                    p.ds_numel if hasattr(p, "ds_numel") else p.numel()
                    for p in engine.module.parameters()
                ),
                "moved_per_step": moved,
            }
            engine.destroy()
    return out


CPU_CASES = [(1, "cpu", True), (2, "cpu", False), (3, "cpu", True), (3, "cpu", False)]


def _check(out, cases):
    ref = plain_adamw_losses(STEPS, GLOBAL_BATCH, LR, BETAS, WD, CLIP, torch.bfloat16)
    for stage, device, bf16_states in cases:
        run = out[(stage, device, bf16_states, True)]
        fp32_master = out[(stage, device, bf16_states, False)]
        what = (stage, device, bf16_states)
        moments = "torch.bfloat16" if bf16_states else "torch.float32"
        kinds = run["state"]["kinds"]
        assert kinds.get("exp_avg") == moments and kinds.get("exp_avg_sq") == moments, what
        assert "fp32_param" not in kinds, what  # no fp32 master beside the bf16 one
        if device == "cpu":
            assert run["state"]["masters"] == {"torch.bfloat16"}, what
            assert run["state"]["master_device"] == {"cpu"}, what
            assert fp32_master["state"]["masters"] == {"torch.float32"}, what
        else:
            assert kinds["param"] == "torch.bfloat16", what
            n = run["partition_numel"]
            per_element = 2 * (2 + 2 * (2 if bf16_states else 4))  # read + written
            assert run["moved_per_step"] == per_element * n, what
            assert fp32_master["moved_per_step"] == 2 * 12 * n, what
        assert run["grad_dtypes"] == {"torch.bfloat16"}, what
        assert run["partition_numel"] <= run["model_numel"] // 2 + 64, what
        assert run["losses"] == pytest.approx(ref, rel=2e-2), what
        assert run["losses"] != fp32_master["losses"], what


def test_bf16_masters_with_cpu_offload_train_like_plain_pytorch_bf16(tmp_path):
    for out in run_ranks(worker, 2, CPU_CASES, str(tmp_path)):
        _check(out, CPU_CASES)


NVME_CASES = [(2, "nvme", True), (3, "nvme", False)]


def test_bf16_masters_on_nvme_move_half_the_bytes_or_less(tmp_path):
    for out in run_ranks(worker, 2, NVME_CASES, str(tmp_path)):
        _check(out, NVME_CASES)


def resume_worker(rank, world, root):
    import zerostream

    micro = GLOBAL_BATCH // world

    def engine_for(device):
        torch.manual_seed(0)
        cfg = _config(micro, 3, device, f"{root}/{device}", bf16_states=True)
        return zerostream.initialize(model=TinyGPT(), config=cfg)[0]

    whole = {}
    for device in ("cpu", "nvme"):
        engine = engine_for(device)
        whole[device] = _train(engine, rank, world, STEPS)
        engine.destroy()
    engine = engine_for("cpu")
    _train(engine, rank, world, 2)
    engine.save_checkpoint(f"{root}/ckpt", tag="half")
    saved = {str(t.dtype) for t in engine.optimizer._fp32_partitions()}
    engine.destroy()
    resumed = {}
    for device in ("cpu", "nvme"):
        engine = engine_for(device)
        engine.load_checkpoint(f"{root}/ckpt", tag="half")
        resumed[device] = _train(engine, rank, world, STEPS - 2, first=2)
        engine.destroy()
    return whole, resumed, saved


def test_a_bf16_master_checkpoint_resumes_bitwise_across_cpu_and_nvme(tmp_path):
    """Both offload devices run the same kernel math, so their losses are bit-equal, and a
    checkpoint saved from "cpu" (bf16 masters in the file, as DeepSpeed saves them) resumes
    bitwise into "cpu" and into "nvme"."""
    for whole, resumed, saved in run_ranks(resume_worker, 2, str(tmp_path)):
        assert whole["cpu"] == whole["nvme"]
        assert saved == {"torch.bfloat16"}
        assert resumed["cpu"] == whole["cpu"][2:]
        assert resumed["nvme"] == whole["cpu"][2:]


def tier_worker(rank, world, root):
    import zerostream

    micro = GLOBAL_BATCH // world
    out = {}
    for max_in_cpu in (0, 7000):
        torch.manual_seed(0)
        cfg = _config(micro, 3, "nvme", f"{root}/{max_in_cpu}", bf16_states=True)
        cfg["zero_optimization"]["sub_group_size"] = 2000
        cfg["zerostream"] = {"optimizer_max_in_cpu": max_in_cpu}
        engine = zerostream.initialize(model=TinyGPT(), config=cfg)[0]
        sw = engine.optimizer.swapper
        before = sw.bytes_read + sw.bytes_written
        losses = _train(engine, rank, world, STEPS)
        host = [s for s in sw.sub_groups if s.on_host]
        out[max_in_cpu] = {
            "losses": losses,
            "moved_per_step": (sw.bytes_read + sw.bytes_written - before) / STEPS,
            "host_dtypes": {str(t.dtype) for s in host for t in s.host},
            "host_elements": sum(s.hi - s.lo for s in host),
            "nvme_elements": sum(s.hi - s.lo for s in sw.sub_groups if not s.on_host),
            "plan_host_bytes": sw.tiers.host_bytes,
            "stored_bytes": int(sw.store.stats()["used_bytes"]),
        }
        engine.destroy()
    return out


def test_bf16_optimizer_tiers_keep_six_bytes_an_element_and_move_only_the_nvme_ones(tmp_path):
    """zerostream.optimizer_max_in_cpu with bf16 masters and moments: the host sub-groups
    are bf16 (6 bytes an element, as the tier plan counts them), only the NVMe ones cross
    the disk (2 x 6 bytes an element a step), the swap files hold just those, and the losses
    are bit-equal to the all-on-NVMe run's."""
    for out in run_ranks(tier_worker, 2, str(tmp_path)):
        disk, tiered = out[0], out[7000]
        assert tiered["host_elements"] > 0 and tiered["nvme_elements"] > 0
        assert tiered["host_dtypes"] == {"torch.bfloat16"}
        assert tiered["plan_host_bytes"] == 6 * tiered["host_elements"]
        assert tiered["moved_per_step"] == 12 * tiered["nvme_elements"]
        assert disk["moved_per_step"] == 12 * (tiered["host_elements"] + tiered["nvme_elements"])
        assert tiered["stored_bytes"] >= 6 * tiered["nvme_elements"]
        assert tiered["stored_bytes"] < disk["stored_bytes"]
        assert tiered["losses"] == disk["losses"]


def client_worker(rank, world, root):
    import zerostream

    cfg = _config(GLOBAL_BATCH, 2, "cpu", root)
    del cfg["optimizer"]
    cfg["zero_force_ds_cpu_optimizer"] = False
    model = TinyGPT()
    try:
        zerostream.initialize(
            model=model, config=cfg, optimizer=torch.optim.AdamW(model.parameters(), lr=LR)
        )
    except ValueError as exc:
        return str(exc)
    return None


def test_an_offloaded_torch_optimizer_cannot_step_bf16_masters_and_says_so(tmp_path):
    """DeepSpeed asserts DeepSpeedCPUAdam here; zerostream names the key and the optimizers
    that can (a torch optimizer would keep bf16 moments it was never asked for)."""
    said = run_ranks(client_worker, 1, str(tmp_path))[0]
    assert said is not None and "bf16.bf16_master_weights_and_grads" in said
    assert "DeepSpeedCPUAdam" in said and "AdamW" in said


def client_states_worker(rank, world, root, fp32_states):
    import zerostream
    from zerostream.ops.adam import DeepSpeedCPUAdam

    cfg = _config(GLOBAL_BATCH, 2, "cpu", root)
    del cfg["optimizer"]
    cfg["bf16"].update(bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
    model = TinyGPT()
    client = DeepSpeedCPUAdam(model.parameters(), lr=LR, fp32_optimizer_states=fp32_states)
    try:
        engine, *_ = zerostream.initialize(model=model, config=cfg, optimizer=client)
    except AssertionError as exc:  # DeepSpeed's type
        return ("ValueError" if isinstance(exc, ValueError) else "other"), str(exc)
    engine.destroy()
    return "accepted", None


@pytest.mark.parametrize("fp32_states", [True, False])
def test_a_client_cpu_adam_with_fp32_states_contradicts_bf16_states(tmp_path, fp32_states):
    """bf16_optimizer_states with a client DeepSpeedCPUAdam: neither is overridden; its
    default fp32_optimizer_states=True is refused by name (DeepSpeed asserts the same), False
    is what the config asks for."""
    said = run_ranks(client_states_worker, 1, str(tmp_path), fp32_states)[0]
    if fp32_states:
        assert said[0] == "ValueError" and "fp32_optimizer_states=False" in said[1]
        assert "bf16.bf16_optimizer_states" in said[1]
    else:
        assert said[0] == "accepted"

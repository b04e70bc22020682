"""A client's Adam with offload_optimizer "nvme" (issue 31 item 2): what Accelerate, and so
the HF Trainer, pass for a config without an "optimizer" section is a DeepSpeedCPUAdam;
DeepSpeed takes it into its NVMe-backed optimizer, and so does zerostream, with the client's
hyperparameters and param groups. The reference is the same client with offload "cpu", which
runs the same kernel over the same elements: the weights must be bit-equal. The state really
is on NVMe (the swap store moved its bytes)."""

import pytest
import torch

import zerostream
from zerostream.ops.adam import DeepSpeedCPUAdam

pytestmark = pytest.mark.usefixtures("one_rank_process_group")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _groups(model):
    # Two groups with their own lr and weight decay: both must reach the NVMe optimizer.
    first, second = list(model[0].parameters()), list(model[2].parameters())
    return [{"params": first}, {"params": second, "lr": 3e-3, "weight_decay": 0.1}]


def _train(make_client, stage, device, tmp_path, **extra):
    model = _model()
    offload = {"device": device}
    if device == "nvme":
        offload["nvme_path"] = str(tmp_path / f"swap{stage}")
    cfg = {
        "train_batch_size": 4,
        "zero_optimization": {"stage": stage, "offload_optimizer": offload},
        **extra,
    }
    engine, *_ = zerostream.initialize(model=model, optimizer=make_client(model), config=cfg)
    for i in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
        engine.backward(engine(x).pow(2).mean())
        engine.step()
    swapper = getattr(engine.optimizer, "swapper", None)
    moved = 0 if swapper is None else swapper.bytes_read + swapper.bytes_written
    hyper = [{k: g[k] for k in ("lr", "weight_decay")} for g in engine.optimizer.param_groups]
    weights = [p.detach().clone() for p in engine.module.parameters()]
    engine.destroy()
    return weights, moved, hyper


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("adamw", [True, False])
def test_a_client_deepspeed_cpu_adam_trains_on_nvme_like_on_cpu(stage, adamw, tmp_path):
    def client(model):
        return DeepSpeedCPUAdam(_groups(model), lr=1e-2, weight_decay=0.01, adamw_mode=adamw)

    nvme, moved, hyper = _train(client, stage, "nvme", tmp_path)
    cpu, _, _ = _train(client, stage, "cpu", tmp_path)
    assert moved > 0  # the state went through the swap store
    assert hyper == [{"lr": 1e-2, "weight_decay": 0.01}, {"lr": 3e-3, "weight_decay": 0.1}]
    for a, b in zip(nvme, cpu):
        assert torch.equal(a, b)


def test_a_client_torch_adamw_on_nvme_steps_like_deepspeed_cpu_adam(tmp_path):
    """torch.optim.AdamW with zero_force_ds_cpu_optimizer false: the NVMe optimizer runs
    DeepSpeedCPUAdam's kernel with the client's settings, as offload "cpu" does."""
    allow = {"zero_force_ds_cpu_optimizer": False}
    torch_w, moved, _ = _train(
        lambda m: torch.optim.AdamW(_groups(m), lr=1e-2, weight_decay=0.01),
        2, "nvme", tmp_path, **allow,
    )  # fmt: skip
    ds_w, _, _ = _train(
        lambda m: DeepSpeedCPUAdam(_groups(m), lr=1e-2, weight_decay=0.01), 2, "cpu", tmp_path
    )
    assert moved > 0
    for a, b in zip(torch_w, ds_w):
        assert torch.equal(a, b)


def test_other_clients_on_nvme_are_refused_by_name(tmp_path):
    from zerostream.optim_factory import ZeRORuntimeException

    # torch's AdamW without the opt-in: DeepSpeed's zero_force_ds_cpu_optimizer error.
    with pytest.raises(ZeRORuntimeException, match="zero_force_ds_cpu_optimizer"):
        _train(lambda m: torch.optim.AdamW(m.parameters()), 2, "nvme", tmp_path)
    with pytest.raises(NotImplementedError, match='offload_optimizer.device "nvme"'):
        _train(
            lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
            2, "nvme", tmp_path, zero_force_ds_cpu_optimizer=False,
            zero_allow_untested_optimizer=True,
        )  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_a_rebuilt_client_cpu_adam_keeps_its_l2_mode(device, tmp_path):
    """DeepSpeedCPUAdam(adamw_mode=False) is Adam with L2 weight decay, which the rebuild over
    ZeRO's partitions used to lose (adamw_mode is not a param-group option): both offload
    devices must train like torch.optim.Adam with the same settings."""
    ref = _model()
    ref_opt = torch.optim.Adam(_groups(ref), lr=1e-2, weight_decay=0.01)
    for i in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
        ref(x).pow(2).mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
    ours, _, _ = _train(
        lambda m: DeepSpeedCPUAdam(_groups(m), lr=1e-2, weight_decay=0.01, adamw_mode=False),
        2, device, tmp_path,
    )  # fmt: skip
    for a, b in zip(ours, ref.parameters()):
        torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)


def test_config_torch_adam_on_nvme_steps_torch_adamw_math(tmp_path):
    """optimizer.params.torch_adam picks torch's implementation of the same update; on NVMe
    zerostream's swapped kernel steps it, equal to torch.optim.AdamW to fp32 rounding (was
    refused)."""
    ref = _model()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01)
    for i in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
        ref(x).pow(2).mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
    adamw = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01, "torch_adam": True}}
    ours, moved, _ = _train(lambda m: None, 2, "nvme", tmp_path, optimizer=adamw)
    assert moved > 0
    for a, b in zip(ours, ref.parameters()):
        torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)

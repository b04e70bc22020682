"""FusedLion: the Lion a non-offloaded `optimizer.type: "Lion"` builds (DeepSpeed's device
Lion). Before it, that config built the CPU kernel's DeepSpeedCPULion, which refuses device
masters: Lion without offload failed at the first step on a GPU.

- Its update equals the plain-torch reference (tests/python/optim/_reference.py) and the CPU
  kernel's, over several steps with weight decay, two groups, a param without a gradient.
- The engine builds it without offload (stages 0-2) and the CPU kernel with offload; on the
  simulated device (masters on the "GPU") a Lion run without offload trains like plain
  PyTorch with the reference update.
"""

import pytest
import torch

from multirank import run_ranks
from zerostream.ops.lion import DeepSpeedCPULion, FusedLion

from ._reference import lion_reference_step

LR, BETAS, WD = 1e-2, (0.9, 0.99), 0.1


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) for n in (7, 33, 5)]


def test_fused_lion_equals_the_reference_and_the_cpu_kernel():
    ref = [p.clone() for p in _params()]
    moms = [torch.zeros_like(p) for p in ref]
    fused = [torch.nn.Parameter(p.clone()) for p in _params()]
    kernel = [torch.nn.Parameter(p.clone()) for p in _params()]
    opt = FusedLion(
        [{"params": fused[:2]}, {"params": fused[2:], "weight_decay": 0.0}],
        lr=LR,
        betas=BETAS,
        weight_decay=WD,
    )
    cpu = DeepSpeedCPULion(
        [{"params": kernel[:2]}, {"params": kernel[2:], "weight_decay": 0.0}],
        lr=LR,
        betas=BETAS,
        weight_decay=WD,
    )
    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        grads = [torch.randn(p.shape, generator=gen) for p in ref]
        for i, (p, m, g) in enumerate(zip(ref, moms, grads)):
            if step == 2 and i == 1:
                continue  # no gradient this step: untouched
            lion_reference_step(p, g, m, lr=LR, betas=BETAS, weight_decay=WD if i < 2 else 0.0)
        for params, o in ((fused, opt), (kernel, cpu)):
            for i, (p, g) in enumerate(zip(params, grads)):
                p.grad = None if (step == 2 and i == 1) else g.clone()
            o.step()
    for r, f, k in zip(ref, fused, kernel):
        torch.testing.assert_close(f.detach(), r, rtol=0, atol=1e-6)
        torch.testing.assert_close(k.detach(), r, rtol=0, atol=1e-6)
    assert opt.state[fused[1]]["step"] == 3 and opt.state[fused[0]]["step"] == 4


def test_bad_hyperparameters_are_named():
    with pytest.raises(ValueError, match="learning rate"):
        FusedLion(_params(), lr=-1.0)
    with pytest.raises(ValueError, match="beta"):
        FusedLion(_params(), betas=(1.5, 0.9))


def _engine_losses(rank, world, offload, on_sim):
    import contextlib

    import zerostream
    from tiny_gpt import TinyGPT, make_batches
    from zerostream.testing import sim_device

    zero = {"stage": 2}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_clipping": 0.0,  # zerostream's default is 1.0; the reference clips nothing
        "optimizer": {
            "type": "Lion",
            "params": {"lr": LR, "betas": list(BETAS), "weight_decay": WD},
        },
        "zero_optimization": zero,
    }
    device = sim_device.installed("lazy", 0, rank) if on_sim else contextlib.nullcontext()
    with device:
        torch.manual_seed(0)
        engine = zerostream.initialize(model=TinyGPT(), config=cfg)[0]
        kind = type(engine.optimizer.optimizer).__name__
        xs, ys = make_batches(3, 4)
        losses = []
        for x, y in zip(xs, ys):
            loss = engine(x.to(engine.device), y.to(engine.device))
            engine.backward(loss)
            engine.step()
            losses.append(float(loss))
        engine.destroy()
    return kind, losses


def _plain_lion_losses():
    from tiny_gpt import TinyGPT, make_batches

    torch.manual_seed(0)
    model = TinyGPT()
    params = list(model.parameters())
    moms = [torch.zeros_like(p) for p in params]
    xs, ys = make_batches(3, 4)
    losses = []
    for x, y in zip(xs, ys):
        model.zero_grad()
        loss = model(x, y)
        loss.backward()
        with torch.no_grad():
            for p, m in zip(params, moms):
                lion_reference_step(p, p.grad, m, lr=LR, betas=BETAS, weight_decay=WD)
        losses.append(float(loss))
    return losses


def engine_worker(rank, world):
    return {
        "host": _engine_losses(rank, world, False, False),
        "sim": _engine_losses(rank, world, False, True),
        "offloaded": _engine_losses(rank, world, True, False),
    }


def test_the_engine_builds_fused_lion_without_offload_and_trains_like_plain_lion():
    out = run_ranks(engine_worker, 1)[0]
    want = _plain_lion_losses()
    assert out["host"][0] == "FusedLion" and out["sim"][0] == "FusedLion"
    assert out["offloaded"][0] == "DeepSpeedCPULion"
    for run in ("host", "sim", "offloaded"):
        assert out[run][1] == pytest.approx(want, rel=1e-5), run


def test_it_steps_params_off_the_host_where_the_cpu_kernel_refuses():
    """Device masters (meta tensors stand in for a GPU's here): FusedLion steps them; the
    CPU kernel's optimizer, which a non-offloaded Lion built before, refuses them."""

    def param():
        p = torch.nn.Parameter(torch.zeros(8, device="meta"))
        p.grad = torch.zeros(8, device="meta")
        return p

    fused = FusedLion([param()], lr=LR, betas=BETAS, weight_decay=WD)
    fused.step()
    assert next(iter(fused.state.values()))["exp_avg"].device.type == "meta"
    with pytest.raises(ValueError, match="CPU"):
        DeepSpeedCPULion([param()], lr=LR).step()

"""Without ZeRO and in fp32, initialize() returns the bare optimizer, as DeepSpeed does (the
client's own object, or the config's FusedAdam), and the gradients are all-reduced at the end
of the backward that ends the accumulation (Note [Stage 0 reduces at the boundary's
backward] in zero/stage0.py), so a script that steps that optimizer itself trains like plain
PyTorch data parallelism on every rank. With mixed precision the wrapper is returned."""

import torch

from multirank import run_ranks

STEPS = 3


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _batches(world, gas):
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, gas, world, 4, 8, generator=g), torch.randn(
        STEPS, gas, world, 4, 1, generator=g
    )


def _train(rank, world, gas, direct):
    import zerostream

    model = _model()
    client = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas,
           "gradient_clipping": 0.0}  # fmt: skip
    engine, optimizer, _, _ = zerostream.initialize(model=model, optimizer=client, config=cfg)
    assert optimizer is client
    xs, ys = _batches(world, gas)
    reduces = []
    for s in range(STEPS):
        for m in range(gas):
            loss = torch.nn.functional.mse_loss(engine(xs[s, m, rank]), ys[s, m, rank])
            engine.backward(loss)
            reduces.append(engine.optimizer._reduced)
            if direct:
                if m == gas - 1:  # the caller steps the optimizer it was given
                    optimizer.step()
                    optimizer.zero_grad()
            else:
                engine.step()
    weights = [p.detach().clone() for p in model.parameters()]
    engine.destroy()
    return weights, reduces


def _reference(world, gas):
    """Plain PyTorch: the mean loss over every rank's micro-batches of a step, one SGD step."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = _batches(world, gas)
    for s in range(STEPS):
        opt.zero_grad()
        for m in range(gas):
            for r in range(world):
                loss = torch.nn.functional.mse_loss(model(xs[s, m, r]), ys[s, m, r])
                (loss / (gas * world)).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_the_bare_client_optimizer_stepped_by_the_caller_trains_like_data_parallel_torch():
    """Stepped directly (as DeepSpeed allows: without engine.step() the engine's micro-step
    count does not advance, so with accumulation every backward would look like the first
    of its step, in DeepSpeed too; the direct case runs without it), and through
    engine.step() with 2 micro-steps, which reduces only at the second backward's end."""
    for gas, direct in ((1, True), (2, False)):
        reference = _reference(2, gas)
        results = run_ranks(_train, 2, gas, direct, timeout=300)
        for weights, reduces in results:
            assert reduces == ([False] * (gas - 1) + [True]) * STEPS, reduces
            for got, want in zip(weights, reference):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def _returned(rank, world, cfg):
    import zerostream

    model = _model()
    engine, optimizer, _, _ = zerostream.initialize(
        model=model, model_parameters=model.parameters(), config=cfg
    )
    names = (type(optimizer).__name__, optimizer is engine.optimizer)
    engine.destroy()
    return names


def test_fp32_gets_the_configs_fused_adam_and_mixed_precision_the_wrapper():
    base = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam"}}
    ((fp32,),) = [run_ranks(_returned, 1, base, timeout=120)]
    ((bf16,),) = [run_ranks(_returned, 1, {**base, "bf16": {"enabled": True}}, timeout=120)]
    ((zero1,),) = [
        run_ranks(_returned, 1, {**base, "zero_optimization": {"stage": 1}}, timeout=120)
    ]
    assert fp32 == ("FusedAdam", False), fp32
    assert bf16[1] is True and zero1[1] is True, (bf16, zero1)

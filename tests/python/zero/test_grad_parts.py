"""A gradient that arrives in parts (Note [A gradient that arrives in parts] in
zero/grad_reduce.py): with reentrant activation checkpointing, a block run twice per forward
(TinyGPT's `reuse`) has its weights' gradient hooks fire once per checkpointed segment, so
each weight's gradient reaches the reducer in two parts in one backward. Every part must be
summed, at stages 1, 2 and 3, with the optimizer on the device or offloaded (where bf16 and
gradient_accumulation_steps 1 download gradients straight into 16-bit host partitions, the
path that kept only the last part), against plain single-process PyTorch: the full gradient
after the first backward (`safe_get_full_grad`), the losses and the final weights.
"""

import pytest
import torch
from test_parity import GLOBAL_BATCH, adamw_config, assert_matches_reference, reference

from multirank import run_ranks
from tiny_gpt import TinyGPT, make_batches

STEPS = 3
MODEL = dict(checkpoint="reentrant", reuse=True)
SHARED = "blocks.1.fc.weight"  # in the block that runs twice
CASES = [
    (stage, dtype, offload)
    for stage in (1, 2, 3)
    for dtype in ("fp32", "bf16")
    for offload in ("none", "cpu")
]


def reference_run(dtype: str):
    """Plain PyTorch on the whole global batch, and the shared weight's gradient after the
    first backward."""
    grads = {}
    run = reference(dtype, steps=STEPS, first_grads=grads, **MODEL)
    return run, grads[SHARED]


def worker(rank, world, cases):
    import torch.distributed as dist

    import zerostream
    from zerostream.utils import safe_get_full_grad

    out = {}
    xs, ys = make_batches(STEPS, GLOBAL_BATCH)
    micro = GLOBAL_BATCH // world
    for stage, dtype, offload in cases:
        torch.manual_seed(0)
        zero = {"stage": stage, "reduce_bucket_size": 3000, "allgather_bucket_size": 500}
        if offload != "none":
            zero["offload_optimizer"] = {"device": offload}
        config = adamw_config(micro, 1, zero, dtype)
        engine, optimizer, _, _ = zerostream.initialize(model=TinyGPT(**MODEL), config=config)
        shared = dict(engine.module.named_parameters())[SHARED]
        losses, norms, first_grad, fired = [], [], None, []
        hook = shared.register_post_accumulate_grad_hook(lambda p, fired=fired: fired.append(1))
        for s in range(STEPS):
            lo = rank * micro
            loss = engine(xs[s][lo : lo + micro], ys[s][lo : lo + micro])
            engine.backward(loss)
            if first_grad is None:
                first_grad = safe_get_full_grad(shared).clone()
                parts = len(fired)
            engine.step()
            total = loss.detach().float().clone()
            dist.all_reduce(total)
            losses.append(float(total) / world)
            norms.append(float(engine.get_global_grad_norm()))
        hook.remove()
        params = {n: p.detach().float().clone() for n, p in engine.module.named_parameters()}
        if stage == 3:
            from zerostream.zero import GatheredParameters

            with GatheredParameters(list(engine.module.parameters())):
                params = {
                    n: p.detach().float().clone() for n, p in engine.module.named_parameters()
                }
        out[(stage, dtype, offload)] = (losses, norms, params, first_grad, parts)
    return out if rank == 0 else None


@pytest.mark.multirank
def test_every_part_of_a_gradient_is_summed():
    refs = {dtype: reference_run(dtype) for dtype in ("fp32", "bf16")}
    results = run_ranks(worker, 2, CASES, timeout=600)[0]
    failures = []
    for (stage, dtype, offload), (losses, norms, params, grad, parts) in results.items():
        run, ref_grad = refs[dtype]
        try:
            # The mechanism: the shared weight's hook fired once per segment.
            assert parts == 2, f"the gradient hook fired {parts} times in one backward"
            rel = float((grad - ref_grad).norm() / ref_grad.norm())
            assert rel <= (1e-5 if dtype == "fp32" else 2e-2), f"gradient off by {rel:.2e}"
            assert_matches_reference(losses, norms, params, run, dtype)
        except AssertionError as exc:
            failures.append(f"stage={stage} {dtype} offload={offload}: {exc}")
    assert not failures, "\n\n".join(failures)

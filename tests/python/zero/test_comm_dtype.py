"""Two ds_config keys that change the gradient math, implemented (they used to be accepted
and ignored): `communication_data_type` (the dtype gradients are summed over ranks in) and
`gradient_allreduce_op` ("sum" keeps the sum over ranks instead of the average).

On 2 ranks each rank's own gradient g_r of a small fp32 model is computed by plain PyTorch;
the reduced gradient zerostream holds after backward (`safe_get_full_grad`, stages 2 and 3,
which reduce during backward) and the global norm it steps with must be what the setting
means: with "bf16" each rank's contribution is
rounded to bf16 and summed in bf16, (bf16(g_0) + bf16(g_1)) / 2, which differs from the fp32
average; with "sum", g_0 + g_1 (and its norm), for every stage that allows it.
"""

import pytest
import torch

from mlp import MLP
from multirank import run_ranks

STAGES = (0, 1, 2, 3)


def _local_grads(rank: int, x: torch.Tensor) -> dict:
    torch.manual_seed(0)
    model = MLP()
    model(x).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _batch(rank: int) -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(100 + rank)) * 3


def worker(rank, world, cases):
    import zerostream
    from zerostream.utils import safe_get_full_grad

    out = {}
    for stage, comm_dtype, op in cases:
        torch.manual_seed(0)
        config = {
            "train_micro_batch_size_per_gpu": 4,
            "gradient_clipping": 0.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 50},
            "communication_data_type": comm_dtype,
            "gradient_allreduce_op": op,
        }
        engine, *_ = zerostream.initialize(model=MLP(), config=config)
        engine.backward(engine(_batch(rank)))
        grads = {n: safe_get_full_grad(p).clone() for n, p in engine.module.named_parameters()}
        engine.step()
        out[(stage, comm_dtype, op)] = (grads, float(engine.get_global_grad_norm()))
        engine.destroy()
    return out if rank == 0 else None


@pytest.mark.multirank
def test_communication_dtype_and_allreduce_op_change_the_reduced_gradients():
    cases = [(s, "bf16", "mean") for s in STAGES] + [(s, "fp32", "sum") for s in (0, 1, 2)]
    results = run_ranks(worker, 2, cases, timeout=300)[0]
    g0, g1 = _local_grads(0, _batch(0)), _local_grads(1, _batch(1))
    failures = []
    for (stage, comm_dtype, op), (grads, norm) in results.items():
        if comm_dtype == "bf16":
            want = {n: (g0[n].bfloat16() + g1[n].bfloat16()).float() / 2 for n in g0}
            fp32_mean = {n: (g0[n] + g1[n]) / 2 for n in g0}
            # The rounding is visible: the bf16 reduction is not the fp32 one.
            assert any(not torch.equal(want[n], fp32_mean[n]) for n in g0)
        else:
            want = {n: g0[n] + g1[n] for n in g0}
        want_norm = float(torch.cat([w.reshape(-1) for w in want.values()]).norm())
        # Stage 1 reduces at the step: before it, safe_get_full_grad sums the local
        # gradients itself (in fp32), so there only the norm the step used tells. Stage 0
        # reduced at the end of the boundary's backward, as stages 2 and 3 during it.
        for n, w in want.items() if stage != 1 or comm_dtype == "fp32" else ():
            if not torch.allclose(grads[n], w, rtol=1e-6, atol=1e-7):
                err = float((grads[n] - w).abs().max())
                failures.append(f"stage {stage} {comm_dtype} {op}: {n} off by {err:.2e}")
        if abs(norm - want_norm) > 1e-5 * want_norm:
            failures.append(f"stage {stage} {comm_dtype} {op}: norm {norm} != {want_norm}")
    assert not failures, "\n".join(failures)

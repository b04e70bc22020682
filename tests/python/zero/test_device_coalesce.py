"""engine.coalesce_grad_reduction() and a plain loss.backward() on the device under test
(the simulated asynchronous device here; Note [The simulated device]): at stages 2 and 3
with the optimizer (and at stage 3 the parameters) offloaded to cpu, so reduced gradients
land in host partitions over the copy stage from the block's end and from the epilogue a
plain backward queues on autograd's engine. Each run, under the "lazy" policy (no copy
completes until something waits for it) and with random delays, must be bit-equal to the
same run on the plain CPU, with nothing reported by the device; the copies went through
the lanes from page-locked memory."""

import pytest
import torch
from test_device_engine import config

from equal import same_tensors
from multirank import run_ranks
from tiny_gpt import TinyGPT, make_batches

STEPS, CHUNKS, BATCH = 2, 2, 8
CASES = [(2, "cpu", "bf16", 1), (3, "cpu", "bf16", 1), (3, "cpu", "fp32", 1)]


def train(rank, world, case, nvme):
    """STEPS steps of CHUNKS backwards in a coalesce block, then one step of a plain
    engine.scale(loss).backward(); the final weights."""
    import zerostream
    from zerostream.zero import GatheredParameters

    micro = BATCH // (world * CHUNKS)
    xs, ys = make_batches(STEPS + 1, BATCH)
    torch.manual_seed(0)
    engine = zerostream.initialize(model=TinyGPT(), config=config(case, micro, nvme))[0]
    device = engine.device
    for s in range(STEPS + 1):
        plain = s == STEPS
        block = engine.coalesce_grad_reduction() if not plain else None
        if block is not None:
            block.__enter__()
        for m in range(CHUNKS):
            lo = (m * world + rank) * micro
            x, y = xs[s][lo : lo + micro].to(device), ys[s][lo : lo + micro].to(device)
            engine.set_gradient_accumulation_boundary(m == CHUNKS - 1)
            loss = engine(x, y)
            if plain:
                engine.scale(loss).backward()
            else:
                engine.backward(loss)
        if block is not None:
            block.__exit__(None, None, None)
        engine.step()
    with GatheredParameters(list(engine.module.parameters())):
        params = {n: p.detach().float().cpu().clone() for n, p in engine.module.named_parameters()}
    engine.destroy()
    return params


def worker(rank, world, root):
    from zerostream.testing import sim_device

    out = {}
    for i, case in enumerate(CASES):
        runs = {"cpu": train(rank, world, case, f"{root}/{i}c")}
        for policy, seed in (("lazy", 0), ("random", 2000 + i)):
            with sim_device.installed(policy=policy, seed=seed, device_index=rank) as sim:
                try:
                    params = train(rank, world, case, f"{root}/{i}{policy}")
                finally:
                    seen = (dict(sim.counters), list(sim.violations))
                    sim.violations.clear()
            runs[policy] = (params, *seen)
        out[case] = runs
    return out if rank == 0 else None


@pytest.mark.device
@pytest.mark.multirank
@pytest.mark.timeout(600)
def test_coalesced_and_plain_backwards_on_the_device_match_the_cpu_run(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("compares against the simulated device; a GPU runs test_device_engine")
    env = {"DEEPSPEED_TIMEOUT": "2"}
    results = run_ranks(worker, 2, str(tmp_path), timeout=600, env=env)[0]
    for case, runs in results.items():
        for policy in ("lazy", "random"):
            params, counters, violations = runs[policy]
            assert violations == [], f"{case} {policy}: the device saw {violations}"
            assert same_tensors(runs["cpu"], params), f"{case} {policy}: not bit-equal"
            assert counters["copies"] > 0 and counters["pageable_copies"] == 0, counters

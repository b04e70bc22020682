"""The engine on the device under test: a CUDA GPU when this machine has one, else the
simulated asynchronous device (zerostream/testing/sim_device.py, Note [The simulated device]).

Stages 1/2/3 x offload none/cpu/nvme x fp32/bf16 x gradient accumulation 1/2 train TinyGPT
on 2 ranks for a few steps, and a subset also saves a checkpoint halfway and resumes it in a
new engine. On the simulated device every case runs under the "lazy" policy (no copy
completes until something waits for it) and, where something is offloaded, again with
seeded random delays (a different seed per case); each run must be bit-equal to the same
run on the plain CPU, with nothing reported by the
device (an unordered copy, a buffer freed under a copy, an upload source rewritten early, a
thread on the wrong device); the mechanism is checked too: copies went through the lanes
and from page-locked memory. On a GPU (world = the GPUs, at most 2) the runs are compared
with plain single-process PyTorch instead (test_parity's references, fp32 bounds widened).

scripts/gpu-check.sh runs these (`-m device`); with --simulated, on the simulated device.
"""

import os

import pytest
import torch
from test_parity import GLOBAL_BATCH, adamw_config, assert_matches_reference, reference

from equal import same_tensors
from multirank import run_ranks
from tiny_gpt import TinyGPT, make_batches

STEPS = 3
RESUME_AT = 2
ON_GPU = torch.cuda.is_available() and os.environ.get("ZS_TEST_DEVICE", "") != "sim"

# (stage, offload, dtype, gas): offload applies to the optimizer; at stage 3 to the
# parameters too ("cpu+none": parameters on the host, optimizer on the device).
CASES = [
    (stage, offload, dtype, gas)
    for stage in (1, 2, 3)
    for offload in ("none", "cpu", "nvme")
    for dtype in ("fp32", "bf16")
    for gas in (1, 2)
] + [(3, "cpu+none", "bf16", 1), (3, "cpu+none", "fp32", 2)]
# "tiered": offload nvme with memory tiers (issue 30): 5000 elements of optimizer state in
# registered host memory, the rest on NVMe, and at stage 3 the parameter shards' "auto",
# which brings them back from disk into a registered arena after the first step.
CASES += [(2, "tiered", "bf16", 1), (3, "tiered", "bf16", 1), (3, "tiered", "fp32", 2)]
CASES += [(3, "tiered", "fp32", 1)]
# "bf16m": bf16 with bf16.bf16_master_weights_and_grads + bf16_optimizer_states (bf16 masters
# and moments, stepped offloaded by the CPU kernels; the masters upload straight from the
# registered arena, no fused copy): compared with the bf16 reference at its bounds.
CASES += [(1, "cpu", "bf16m", 1), (2, "nvme", "bf16m", 1), (3, "cpu", "bf16m", 1)]
CASES += [(3, "nvme", "bf16m", 1), (3, "tiered", "bf16m", 1)]
# "ratio": offload_optimizer.ratio 0.5 (Note [The device tier]): the first sub-groups are
# stepped on the device from gradients landed there, the rest offloaded: "cpu" (the host
# tier), "cpu+ratio" (parameters in host memory too, so the device tier's results go down to
# the host partitions), "ratio3" (NVMe with 5000 elements in host memory: all three tiers),
# "ratioh" (zerostream.device_tier_grads "host": its gradients go down and back up on the
# copy stage).
CASES += [(3, "ratio", "bf16", 1), (3, "ratio", "fp32", 2), (3, "cpu+ratio", "bf16", 1)]
CASES += [(3, "ratio3", "bf16", 1), (3, "ratio", "bf16m", 1), (3, "ratioh", "bf16", 1)]
# "ovl": zerostream.overlap_step "next_forward" (zero/overlap.py), the update on a thread of
# its own while the next forward gathers: shards on the device ("none+ovl": their pieces
# uploaded from that thread, each gather waiting for its own on the compute stream) or in
# host memory ("ovl", as "cpu"), with persistent params (gathered first at the next forward's
# start).
CASES += [(3, "none+ovl", "bf16", 1), (3, "ovl", "fp32", 2)]
# "nvovl": the same with offload_optimizer nvme (the sub-group pipeline behind the forward,
# persistent ranges first: offload/swap_early.py), shards on the device ("none+nvovl") or on
# NVMe too ("nvovl": written from the update's thread while the forward reads others).
CASES += [(3, "none+nvovl", "bf16", 1), (3, "nvovl", "fp32", 1)]
# "spec": overlap_step "backward" (zero/speculate.py), the update started during the backward
# on pieces whose gradients have landed (their downloads host-waited on the speculation's
# thread), then behind the next forward at stage 3 ("none+spec": shards on the device) or
# finished by step() at stage 2.
CASES += [(3, "none+spec", "bf16", 1), (2, "spec", "bf16", 1)]
# "devmax": zerostream.optimizer_max_on_device at stages 1 and 2 (offload_optimizer cpu, the
# first 4000 elements' sub-groups of each rank's partition stepped on the device from
# gradients landed there, the rest by the CPU kernel).
CASES += [(2, "devmax", "bf16", 1), (1, "devmax", "fp32", 2), (2, "devmax", "bf16m", 1)]
if os.environ.get("ZS_DEVICE_CASES") == "quick":  # gpu-check's stream-sanitizer pass
    CASES = [(s, o, "bf16", 1) for s in (1, 2, 3) for o in ("cpu", "nvme")]
RESUMED = {(s, o, "bf16", 1) for s in (1, 2, 3) for o in ("cpu", "nvme")} | {
    (3, "tiered", "bf16", 1),
    (3, "nvme", "bf16m", 1),
    (3, "ratio", "bf16", 1),
    (3, "none+ovl", "bf16", 1),  # saved right after an overlapped step: the save waits
}


def config(case, micro: int, nvme: str) -> dict:
    stage, offload, dtype, gas = case
    zero = {
        "stage": stage,
        "reduce_bucket_size": 3000,
        "allgather_bucket_size": 500,
        "sub_group_size": 2000,
        "stage3_param_persistence_threshold": 0,
        "stage3_prefetch_bucket_size": 3000,
    }
    devmax = offload == "devmax"
    if devmax:
        offload = "none+cpu"
    speculate = offload.endswith("spec")
    if speculate:
        offload = offload.replace("spec", "ovl")
    overlap = offload.endswith("ovl")
    if overlap:
        zero["stage3_param_persistence_threshold"] = 100
        offload = offload.replace("nvovl", "nvme").replace("ovl", "cpu")
    tiered = offload in ("tiered", "ratio3")
    ratio = offload.endswith("ratio") or offload in ("ratio3", "ratioh")
    host_grads = offload == "ratioh"
    offload = {"tiered": "nvme", "ratio3": "none+nvme", "ratio": "none+cpu"}.get(offload, offload)
    offload = "none+cpu" if host_grads else offload
    offload = offload.replace("+ratio", "+cpu")
    param, opt = (offload.split("+") + [offload])[:2]  # "cpu+none": params cpu, optimizer none
    if opt != "none":
        zero["offload_optimizer"] = {"device": opt, "nvme_path": f"{nvme}/opt"}
        if ratio:
            zero["offload_optimizer"]["ratio"] = 0.5
    if stage == 3 and param != "none":
        zero["offload_param"] = {"device": param, "nvme_path": f"{nvme}/param"}
        if tiered and not ratio:
            zero["offload_param"]["max_in_cpu"] = "auto"
        elif overlap and param == "nvme":  # every shard on disk, written behind the forward
            zero["offload_param"]["max_in_cpu"] = 0
    cfg = adamw_config(micro, gas, zero, "bf16" if dtype == "bf16m" else dtype)
    if dtype == "bf16m":
        cfg["bf16"].update(bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
    if tiered:
        cfg["zerostream"] = {**cfg.get("zerostream", {}), "optimizer_max_in_cpu": 5000}
    if host_grads:
        cfg["zerostream"] = {**cfg.get("zerostream", {}), "device_tier_grads": "host"}
    if overlap:
        mode = "backward" if speculate else "next_forward"
        cfg["zerostream"] = {**cfg.get("zerostream", {}), "overlap_step": mode}
    if devmax:
        cfg["zerostream"] = {**cfg.get("zerostream", {}), "optimizer_max_on_device": 4000}
    return cfg


def _params(engine) -> dict:
    from zerostream.zero import GatheredParameters

    with GatheredParameters(list(engine.module.parameters())):
        return {n: p.detach().float().cpu().clone() for n, p in engine.module.named_parameters()}


def train(rank, world, case, nvme: str, resume_dir=None) -> tuple:
    """Losses (mean over ranks), pre-clip norms and final weights of STEPS steps; with
    `resume_dir`, saved after RESUME_AT steps and continued by a new engine from there."""
    import torch.distributed as dist

    import zerostream

    gas = case[3]
    micro = GLOBAL_BATCH // (world * gas)
    xs, ys = make_batches(STEPS, GLOBAL_BATCH)
    cfg = config(case, micro, nvme)

    def engine_for():
        torch.manual_seed(0)
        return zerostream.initialize(model=TinyGPT(), config=cfg)[0]

    engine = engine_for()
    device = engine.device
    losses, norms = [], []
    for s in range(STEPS):
        if resume_dir is not None and s == RESUME_AT:
            engine.save_checkpoint(resume_dir)
            engine.destroy()
            engine = engine_for()
            engine.load_checkpoint(resume_dir)
        total = torch.zeros((), device=device)
        for m in range(gas):
            lo = (m * world + rank) * micro
            x, y = xs[s][lo : lo + micro].to(device), ys[s][lo : lo + micro].to(device)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            total += loss.detach().float()
        dist.all_reduce(total)
        losses.append(float(total) / (world * gas))
        norms.append(float(engine.get_global_grad_norm()))
    summary = engine.optimizer.state_summary()
    params = _params(engine)
    engine.destroy()  # its swap files go now: a rank's exit does not run the atexit cleanup
    return losses, norms, params, summary


def worker(rank, world, cases, root, device_kind):
    from zerostream.testing import sim_device

    out = {}
    for i, case in enumerate(cases):
        nvme = f"{root}/{i}"
        resume = f"{root}/ckpt{i}" if case in RESUMED else None
        if device_kind == "cuda":
            out[case] = {"cuda": train(rank, world, case, nvme, resume)}
            continue
        runs = {"cpu": train(rank, world, case, nvme + "c", resume and resume + "c")}
        # Without offload nothing crosses the lanes: the lazy run checks the device binding.
        policies = (("lazy", 0),) + ((("random", 1000 + i),) if case[1] != "none" else ())
        for policy, seed in policies:
            with sim_device.installed(policy=policy, seed=seed, device_index=rank) as sim:
                try:
                    run = train(rank, world, case, f"{nvme}{policy}", resume and resume + policy)
                finally:
                    seen = (dict(sim.counters), list(sim.violations))
                    sim.violations.clear()  # asserted by the test, with the case's name
            runs[policy] = run + seen
        out[case] = runs
    return out if rank == 0 else None


def _assert_close_to_reference(losses, norms, params, reference_run, dtype) -> None:
    """On a GPU: test_parity's bounds, fp32 ones widened to 2e-4 (cuBLAS and the attention
    kernels round differently from the CPU reference; Adam turns that into small steps)."""
    if dtype in ("bf16", "bf16m"):
        assert_matches_reference(losses, norms, params, reference_run, "bf16")
        return
    ref_losses, ref_norms, ref_params = reference_run
    tol = dict(rtol=2e-4, atol=1e-5)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **tol)
    torch.testing.assert_close(torch.tensor(norms), torch.tensor(ref_norms), **tol)
    for name, ref in ref_params.items():
        rel = float((params[name] - ref).norm() / ref.norm())
        assert rel <= 2e-4, f"{name}: relative error {rel:.2e}"


def _assert_tiered(summary: dict, case) -> None:
    swap = summary["swap"]
    assert swap["host_elements"] > 0 and swap["nvme_elements"] > 0, swap
    # Every shard came back (the tiny model fits any host) when the third forward began:
    # one recorded the trace, the next ran its plan. Not in a resumed engine (one step).
    if case[0] == 3 and case not in RESUMED:
        assert summary["params"]["swap"]["kept_bytes"] > 0, summary["params"]["swap"]


def _assert_device_tier(summary: dict, offload: str) -> None:
    """A ratio case: its first sub-groups really were on the device (and, for "ratio3",
    others in host memory and on NVMe)."""
    swap = summary["swap"]
    tiers = {s["tier"] for s in swap["sub_groups"]}
    assert swap["device_elements"] > 0 and "device" in tiers, swap["sub_groups"]
    if offload == "ratio3":
        assert tiers == {"device", "host", "nvme"}, swap["sub_groups"]


def _bit_equal(a, b) -> bool:
    return a[0] == b[0] and a[1] == b[1] and same_tensors(a[2], b[2])


@pytest.fixture(scope="module")
def references():
    return {dtype: reference(dtype, steps=STEPS) for dtype in ("fp32", "bf16")}


def _run_matrix(world: int, cases, tmp_path, references) -> None:
    kind = "cuda" if ON_GPU else "sim"
    # A rank that fails leaves the other in a collective: 2 minutes, not the default 10.
    env = {"DEEPSPEED_TIMEOUT": "2"}
    results = run_ranks(worker, world, cases, str(tmp_path), kind, timeout=1200, env=env)[0]
    failures = []
    for case, runs in results.items():
        stage, offload, dtype, gas = case
        try:
            if kind == "cuda":
                losses, norms, params, summary = runs["cuda"]
                if offload == "tiered":
                    _assert_tiered(summary, case)
                if "ratio" in offload or offload == "devmax":
                    _assert_device_tier(summary, offload)
                ref = references["bf16" if dtype == "bf16m" else dtype]
                _assert_close_to_reference(losses, norms, params, ref, dtype)
                continue
            cpu = runs["cpu"]
            if dtype == "bf16m":  # the CPU run itself at the bounds a GPU run is held to
                _assert_close_to_reference(*cpu[:3], references["bf16"], dtype)
            if offload == "tiered":  # the state really was in both tiers
                for run in runs.values():
                    _assert_tiered(run[3], case)
            if "ratio" in offload or offload == "devmax":
                for run in runs.values():
                    _assert_device_tier(run[3], offload)
            if offload == "devmax" and dtype != "bf16m":  # the split update is the update
                _assert_close_to_reference(*cpu[:3], references[dtype], dtype)
            if world == 1 and stage == 3 and "ratio" not in offload:
                # Note [One rank on the host lands each gradient as it comes]: the CPU run
                # lands without buckets; a copy stage keeps them (one download a bucket).
                assert cpu[3]["landed_directly"] > 0, cpu[3]
                if "lazy" in runs and offload not in ("none", "cpu+none"):
                    assert runs["lazy"][3]["landed_directly"] == 0, runs["lazy"][3]
            for policy in [p for p in ("lazy", "random") if p in runs]:
                run = runs[policy]
                counters, violations = run[4], run[5]
                assert violations == [], f"{policy}: the device saw {violations}"
                assert _bit_equal(cpu, run), (
                    f"{policy}: not bit-equal to the CPU run: losses {run[0]} vs {cpu[0]}"
                )
                if offload != "none":
                    # The offloaded bytes really crossed on the lanes, from page-locked memory.
                    assert counters["copies"] > 0, counters
                    assert counters["pageable_copies"] == 0, counters
                    assert counters["spin_waits"] == 0, counters
        except AssertionError as exc:
            failures.append(
                f"world={world} stage={stage} offload={offload} {dtype} gas={gas}: {exc}"
            )
    assert not failures, "\n\n".join(failures)


@pytest.mark.device
@pytest.mark.multirank
@pytest.mark.timeout(1500)  # 52 cases x 2-3 runs on 2 ranks: about 100 s on an idle 2-core VM
def test_the_engine_on_the_device_matches_the_cpu_run(tmp_path, references):
    world = min(2, torch.cuda.device_count()) if ON_GPU else 2
    _run_matrix(world, CASES, tmp_path, references)


# On one rank there is no collective between a rank's gradients and its download (stage 1
# downloads its accumulator itself, which it zeroes next) nor between a gather's uploads and
# the parameters (the send buffer is the gathered tensor): other waits carry the order.
ONE_RANK = [(s, o, "bf16", 1) for s in (1, 2, 3) for o in ("cpu", "nvme")] + [
    (1, "cpu", "fp32", 2),
    (3, "cpu+none", "fp32", 1),
    (3, "none+ovl", "bf16", 1),
]


@pytest.mark.device
@pytest.mark.multirank
@pytest.mark.timeout(900)
def test_the_engine_on_one_rank_matches_the_cpu_run(tmp_path, references):
    if ON_GPU and torch.cuda.device_count() == 1:
        pytest.skip("one GPU: the test above already ran on one rank")
    _run_matrix(1, ONE_RANK, tmp_path, references)


def parking_worker(rank, world, on_gpu):
    """engine.offload_states / reload_states on the device: a GPU, or the simulated one (lazy
    completion: a copy's destination holds poison until the host has waited for it)."""
    import contextlib

    import zerostream
    from mlp import MLP
    from zerostream.testing import sim_device
    from zerostream.zero import state_offload

    if not on_gpu:
        state_offload._COPY_HOST_TENSORS = True  # the sim's device memory is host memory
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": 2},
    }
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(rank))
    device = (
        contextlib.nullcontext(None)
        if on_gpu
        else sim_device.installed("lazy", 0, rank, track_memory=True)
    )
    with device as sim:
        torch.manual_seed(0)
        engine, *_ = zerostream.initialize(model=MLP(), config=config)
        x = x.to(engine.device)
        try:
            for _ in range(2):
                engine.backward(engine(x))
                engine.step()
            groups = engine.optimizer.offloadable_states()
            tensors = [t for g in groups.values() for t in g.tensors]
            values = [t.clone() for t in tensors]
            copies = sim.counters["copies"] if sim else 0
            emptied = sim.counters["empty_cache"] if sim else 0
            engine.offload_states(non_blocking=True)
            # What the caching allocator keeps is given back (another process may use it):
            # reserved == allocated afterwards, on the sim's allocator model as on a GPU.
            if sim:
                cache = (
                    sim.counters["empty_cache"] - emptied,
                    sim.memory.reserved_bytes() - sim.memory.allocated_bytes(),
                )
            else:
                cache = (1, torch.cuda.memory_reserved() - torch.cuda.memory_allocated())
            on_host = all(t.device.type == "cpu" for t in tensors)
            parked = all(torch.equal(t, v.cpu()) for t, v in zip(tensors, values))  # at once
            engine.reload_states(non_blocking=True)
            back = all(torch.equal(t, v) for t, v in zip(tensors, values))
            moved = sim.counters["copies"] - copies if sim else 2 * len(tensors)
            engine.backward(engine(x))
            engine.step()
            finite = all(bool(p.isfinite().all()) for p in engine.module.parameters())
        finally:
            engine.destroy()
            violations = list(sim.violations) if sim else []
            if sim:
                sim.violations.clear()
    return parked and on_host, back, moved, len(tensors), finite, violations, cache


@pytest.mark.device
@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_parked_states_are_readable_when_offload_states_returns(tmp_path):
    """Each parked tensor crosses a lane both ways, and both calls return only once the
    copies are complete: without the waits the host copies read as the sim's poison (on a
    GPU: whatever the copy had not yet written)."""
    world = min(2, torch.cuda.device_count()) if ON_GPU else 2  # NCCL: one GPU per rank
    results = run_ranks(parking_worker, world, ON_GPU)
    for parked, back, moved, count, finite, violations, cache in results:
        assert violations == [], violations
        emptied, cached = cache
        # offload_states emptied the allocator's cache once: nothing reserved beyond what
        # is allocated (a GPU rounds blocks: up to 2 MiB of one partly used segment)
        assert emptied == 1 and 0 <= cached <= (2 << 20 if ON_GPU else 0), cache
        assert moved == 2 * count > 0, (moved, count)
        assert parked and back and finite

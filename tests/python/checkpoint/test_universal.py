"""DeepSpeed's universal checkpoint (zerostream/checkpoint/universal.py, universal_load.py):
a ZeRO stage 1-3 checkpoint of 2 ranks converted by parameter name, then loaded with
checkpoint.load_universal into 1 and 2 ranks at every stage 1-3, and the run continues.

The reference is plain PyTorch: torch.optim.AdamW on the whole global batch, gradients
clipped by torch.nn.utils.clip_grad_norm_, its lr set
each step by DeepSpeed's WarmupLR formula (linear warm-up, written out below from
DeepSpeed's lr_schedules.py). Right after the load, every parameter's fp32 master, Adam
moments and step and the lr equal the reference's after N steps; after M more steps the
losses and the masters and moments match the reference's to fp32 rounding.
"""

import math
import os
import shutil

import pytest
import torch

from multirank import run_ranks

N, M = 3, 3  # steps before the save, steps after the load
GLOBAL_BATCH = 8
LR, MIN_LR, WARMUP, WD = 1e-2, 1e-3, 4, 0.01
CLIP = 1.0  # DeepSpeed's gradient_clipping default since 0.19.3
TOL = dict(rtol=1e-5, atol=1e-6)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.Tanh(), torch.nn.Linear(9, 4))


def batches(steps: int):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(GLOBAL_BATCH, 6, generator=g), torch.randn(GLOBAL_BATCH, 4, generator=g))
        for _ in range(steps)
    ]


def warmup_lr(step: int) -> float:
    """DeepSpeed's WarmupLR (warmup_type linear) for optimizer step `step` (0-based): the
    scheduler steps after each optimizer step, starting from last_batch_iteration -1, where
    it gives min_lr."""
    it = step - 1
    if it < 0:
        return MIN_LR
    gamma = it / WARMUP if it < WARMUP else 1.0
    return MIN_LR + (LR - MIN_LR) * gamma


def reference(steps: int):
    """Plain PyTorch: (losses, {name: (master, exp_avg, exp_avg_sq, step)}, lr) after each
    of `steps` steps (the last entries)."""
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WD)
    losses, snaps = [], []
    for i, (x, y) in enumerate(batches(steps)):
        for g in opt.param_groups:
            g["lr"] = warmup_lr(i)
        loss = torch.nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
        snaps.append(
            {
                n: tuple(
                    [p.detach().clone()]
                    + [opt.state[p][k].clone() for k in ("exp_avg", "exp_avg_sq")]
                    + [float(opt.state[p]["step"])]
                )
                for n, p in net.named_parameters()
            }
        )
    return losses, snaps


def config(
    stage: int, world: int, offload: bool = False, universal: bool = False, bf16: bool = False
) -> dict:
    zero = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    cfg = {
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": CLIP,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}},
        "scheduler": {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": MIN_LR,
                "warmup_max_lr": LR,
                "warmup_num_steps": WARMUP,
                "warmup_type": "linear",
            },
        },
        "zero_optimization": zero,
    }
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    if bf16:
        cfg["bf16"] = {"enabled": True}
    return cfg


def _engine(stage, world, offload=False, universal=False, bf16=False):
    import zerostream

    net = model()
    engine, *_ = zerostream.initialize(
        model=net,
        model_parameters=net.parameters(),
        config=config(stage, world, offload, universal, bf16),
    )
    return engine


def _train(engine, rank, world, steps):
    """Losses of `steps` steps, each rank on its slice of the global batch; a step's loss is
    the mean over ranks (equal slices: the global batch's mean)."""
    import torch.distributed as dist

    per = GLOBAL_BATCH // world
    dtype = next(engine.module.parameters()).dtype  # bf16 runs take bf16 inputs
    losses = []
    for x, y in steps:
        x, y = x[rank * per : (rank + 1) * per].to(dtype), y[rank * per : (rank + 1) * per]
        loss = torch.nn.functional.mse_loss(engine(x).float(), y)
        engine.backward(loss)
        engine.step()
        value = loss.detach().clone()
        if world > 1:
            dist.all_reduce(value)
        losses.append(value.item() / world)
    return losses


def _state(engine):
    """{name: (master, exp_avg, exp_avg_sq, step)} whole, and the lr (collectives)."""
    from zerostream.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    out = {}
    for n, p in engine.module.named_parameters():
        moments = [safe_get_full_optimizer_state(p, k).clone() for k in ("exp_avg", "exp_avg_sq")]
        out[n] = tuple([safe_get_full_fp32_param(p).clone()] + moments)
    inner = engine.optimizer.state_dict()
    return out, engine.get_lr()[0], inner


def _save_runs(rank, world, root, stages, offload):
    for stage in stages:
        engine = _engine(stage, world, offload)
        _train(engine, rank, world, batches(N))
        engine.save_checkpoint(os.path.join(root, f"s{stage}"), tag="t")
        engine.destroy()


def _resume_runs(rank, world, root, pairs, offload):
    """For each (saved stage, this run's stage): load the universal checkpoint, report the
    state, continue M steps."""
    out = {}
    for saved, stage in pairs:
        engine = _engine(stage, world, offload, universal=True)
        path, client = engine.load_checkpoint(os.path.join(root, f"s{saved}"))
        state, lr, _ = _state(engine)
        steps = engine.global_steps
        losses = _train(engine, rank, world, batches(N + M)[N:])
        final, _, _ = _state(engine)
        out[(saved, stage)] = dict(
            path=path, client=client, state=state, lr=lr, steps=steps, losses=losses, final=final
        )
        engine.destroy()
    return out


def _convert(root, stages):
    from zerostream.checkpoint import universal

    for s in stages:
        folder = os.path.join(root, f"s{s}")
        universal.convert(os.path.join(folder, "t"), os.path.join(folder, "t_universal"), True)


def _check(result, ref_losses, ref_snaps, step_tensor_ok=True):
    assert result["steps"] == N
    assert result["lr"] == pytest.approx(warmup_lr(N))  # the scheduler's state came back
    ref = ref_snaps[N - 1]
    assert set(result["state"]) == set(ref)
    for name, (master, m, v) in result["state"].items():
        torch.testing.assert_close(master, ref[name][0], **TOL, msg=f"{name} master")
        torch.testing.assert_close(m, ref[name][1], **TOL, msg=f"{name} exp_avg")
        torch.testing.assert_close(v, ref[name][2], **TOL, msg=f"{name} exp_avg_sq")
    assert result["losses"] == pytest.approx(ref_losses[N:], rel=1e-5, abs=1e-7)
    end = ref_snaps[-1]
    for name, (master, m, v) in result["final"].items():
        torch.testing.assert_close(master, end[name][0], **TOL, msg=f"{name} master")
        torch.testing.assert_close(m, end[name][1], **TOL, msg=f"{name} exp_avg")
        torch.testing.assert_close(v, end[name][2], **TOL, msg=f"{name} exp_avg_sq")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Stages 1-3 trained N steps on 2 ranks, saved and converted (one spawn)."""
    root = str(tmp_path_factory.mktemp("universal"))
    run_ranks(_save_runs, 2, root, (1, 2, 3), False, timeout=240)
    _convert(root, (1, 2, 3))
    return root


PAIRS = [(s, t) for s in (1, 2, 3) for t in (1, 2, 3)]


@pytest.mark.parametrize("world", [1, 2])
def test_universal_resumes_at_any_world_size_and_stage(converted, world):
    """2 ranks at stage s -> universal -> `world` ranks at every stage t: the state after
    the load and the next M steps match plain PyTorch AdamW."""
    ref_losses, ref_snaps = reference(N + M)
    results = run_ranks(_resume_runs, world, converted, PAIRS, False, timeout=400)[0]
    for pair in PAIRS:
        r = results[pair]
        assert r["path"] is not None and "t_universal" in r["path"], (pair, r["path"])
        try:
            _check(r, ref_losses, ref_snaps)
        except AssertionError as exc:
            raise AssertionError(
                f"saved at stage {pair[0]}, loaded at stage {pair[1]}: {exc}"
            ) from exc


def test_the_layout_is_deepspeeds(converted):
    """zero/<name>/{fp32,exp_avg,exp_avg_sq}.pt hold {'param': whole value, 'cat_dim': 0},
    step.pt the step; the values equal plain PyTorch's after N steps; latest_universal
    names the folder; the model-states files are copied."""
    _, ref_snaps = reference(N)
    ref = ref_snaps[-1]
    for s in (1, 2, 3):
        out = os.path.join(converted, f"s{s}", "t_universal")
        with open(os.path.join(converted, f"s{s}", "latest_universal")) as f:
            assert f.read() == "t_universal"
        models = sorted(n for n in os.listdir(out) if n.endswith("model_states.pt"))
        assert models == (
            ["mp_rank_00_model_states.pt"]
            if s < 3
            else [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(2)]
        )
        assert set(os.listdir(os.path.join(out, "zero"))) == set(ref) | {"optimizer_state.pt"}
        for name, (master, m, v, step) in ref.items():
            for kind, want in (("fp32", master), ("exp_avg", m), ("exp_avg_sq", v)):
                got = torch.load(os.path.join(out, "zero", name, f"{kind}.pt"), weights_only=False)
                assert set(got) == {"param", "cat_dim"} and got["cat_dim"] == 0
                assert got["param"].shape == want.shape
                torch.testing.assert_close(got["param"], want, **TOL)
            saved = torch.load(os.path.join(out, "zero", name, "step.pt"), weights_only=False)
            assert float(saved) == step == N
        optim = torch.load(os.path.join(out, "zero", "optimizer_state.pt"), weights_only=False)
        assert optim["param_groups"][0]["weight_decay"] == WD
        assert math.isclose(optim["param_groups"][0]["lr"], warmup_lr(N))  # the next step's


def _load_only(rank, world, root, stage):
    engine = _engine(stage, world, universal=True)
    try:
        engine.load_checkpoint(root)
    except Exception as exc:  # noqa: BLE001 - the message is what the test checks
        return f"{type(exc).__name__}: {exc}"
    return None


def test_a_missing_or_misshaped_file_names_it(converted, tmp_path):
    """A parameter file that is missing or holds another shape fails the load naming the
    file and the parameter, on every rank, before anything was overwritten."""
    src = os.path.join(converted, "s2")
    bad = str(tmp_path / "bad")
    shutil.copytree(src, bad)
    victim = os.path.join(bad, "t_universal", "zero", "2.weight", "exp_avg.pt")
    os.remove(victim)
    messages = run_ranks(_load_only, 2, bad, 1, timeout=120)
    for message in messages:
        assert message is not None and "'2.weight'" in message and "exp_avg.pt" in message
        assert os.path.dirname(victim) in message, message

    shutil.rmtree(os.path.join(bad, "t_universal", "zero", "0.bias"))
    message = run_ranks(_load_only, 1, bad, 3, timeout=120)[0]
    assert message is not None and "'0.bias'" in message, message

    shutil.rmtree(bad)
    shutil.copytree(src, bad)
    fp32 = os.path.join(bad, "t_universal", "zero", "0.weight", "fp32.pt")
    torch.save({"param": torch.zeros(9, 5), "cat_dim": 0}, fp32)
    message = run_ranks(_load_only, 1, bad, 2, timeout=120)[0]
    assert message is not None and fp32 in message and "'0.weight'" in message, message
    assert "(9, 5)" in message and "(9, 6)" in message, message


def test_no_latest_universal_is_an_error(converted, tmp_path):
    """load_universal without a tag reads latest_universal; without it, the load fails
    naming the file (DeepSpeed raises ValueError there too)."""
    bad = str(tmp_path / "nolatest")
    shutil.copytree(os.path.join(converted, "s1"), bad)
    os.remove(os.path.join(bad, "latest_universal"))
    message = run_ranks(_load_only, 1, bad, 1, timeout=120)[0]
    assert message is not None and message.startswith("ValueError")
    assert os.path.join(bad, "latest_universal") in message, message


def test_offloaded_optimizer_saves_and_loads_universal(tmp_path):
    """offload_optimizer cpu (DeepSpeedCPUAdam's state on the host) on both sides: stage 2
    on 2 ranks -> universal -> stage 3 on 1 rank and stage 1 on 2 ranks, against plain
    PyTorch."""
    root = str(tmp_path)
    run_ranks(_save_runs, 2, root, (2,), True, timeout=240)
    _convert(root, (2,))
    ref_losses, ref_snaps = reference(N + M)
    for world, stage in ((1, 3), (2, 1)):
        result = run_ranks(_resume_runs, world, root, [(2, stage)], True, timeout=240)[0]
        _check(result[(2, stage)], ref_losses, ref_snaps)


def _bf16_save(rank, world, root):
    """Stage 2 in bf16 on 2 ranks: N steps, a save, M more (the uninterrupted losses)."""
    engine = _engine(2, world, bf16=True)
    _train(engine, rank, world, batches(N))
    engine.save_checkpoint(root, tag="t")
    losses = _train(engine, rank, world, batches(N + M)[N:])
    engine.destroy()
    return losses


def _bf16_resume(rank, world, root, stage):
    engine = _engine(stage, world, universal=True, bf16=True)
    engine.load_checkpoint(root)
    state, lr, _ = _state(engine)
    from zerostream.zero import GatheredParameters

    params = list(engine.module.parameters())
    with GatheredParameters(params):
        weights = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    losses = _train(engine, rank, world, batches(N + M)[N:])
    engine.destroy()
    return dict(state=state, lr=lr, weights=weights, losses=losses, steps=engine.global_steps)


def test_bf16_masters_and_moments_load_exactly(tmp_path):
    """bf16 with fp32 masters: stage 2 on 2 ranks -> universal -> stage 3 on 1 rank and
    stage 2 on 2 ranks. After the load the masters and moments are bit-equal to the
    universal files and the bf16 weights are the masters rounded; at the saving world size
    and stage the next M losses equal the uninterrupted run's."""
    root = str(tmp_path)
    uninterrupted = run_ranks(_bf16_save, 2, root, timeout=240)[0]
    from zerostream.checkpoint import universal

    universal.convert(os.path.join(root, "t"), os.path.join(root, "t_universal"), True)
    for world, stage in ((1, 3), (2, 2)):
        r = run_ranks(_bf16_resume, world, root, stage, timeout=240)[0]
        assert r["lr"] == pytest.approx(warmup_lr(N))
        for name, (master, m, v) in r["state"].items():
            folder = os.path.join(root, "t_universal", "zero", name)
            for kind, got in (("fp32", master), ("exp_avg", m), ("exp_avg_sq", v)):
                want = torch.load(os.path.join(folder, f"{kind}.pt"), weights_only=False)
                assert torch.equal(got, want["param"]), (world, stage, name, kind)
            assert r["weights"][name].dtype == torch.bfloat16
            assert torch.equal(r["weights"][name], master.to(torch.bfloat16)), (stage, name)
        if (world, stage) == (2, 2):
            assert r["losses"] == uninterrupted, (r["losses"], uninterrupted)


def test_deepspeeds_command_line_writes_the_same_checkpoint(converted, tmp_path):
    """`python -m deepspeed.checkpoint.ds_to_universal` with DeepSpeed's flags (the compat
    package) writes the files the conversion wrote, bit for bit; without
    universal_checkpoint_info and --inject_missing_state it refuses, naming the file."""
    import subprocess
    import sys

    import zerostream

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    env = dict(os.environ)
    # The zerostream this run imported (installed under scripts/test.sh): a clean clone's
    # python/zerostream has no built _C, so the checkout must not shadow it.
    zs_site = os.path.dirname(os.path.dirname(os.path.abspath(zerostream.__file__)))
    paths = [os.path.join(repo, "python", "deepspeed_compat"), zs_site]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    src = os.path.join(converted, "s1", "t")
    out = str(tmp_path / "cli" / "u")
    base = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal"]
    args = ["--input_folder", src, "--output_folder", out, "--num_extract_workers", "2"]
    refused = subprocess.run(base + args, env=env, capture_output=True, text=True)
    assert refused.returncode != 0
    assert "universal_checkpoint_info" in refused.stderr and src in refused.stderr
    done = subprocess.run(base + args + ["--inject_missing_state"], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "cli" / "latest_universal") as f:
        assert f.read() == "u"
    ours = os.path.join(converted, "s1", "t_universal", "zero")
    for name in os.listdir(ours):
        if name == "optimizer_state.pt":
            continue
        for kind in os.listdir(os.path.join(ours, name)):
            a = torch.load(os.path.join(ours, name, kind), weights_only=False)
            b = torch.load(os.path.join(out, "zero", name, kind), weights_only=False)
            if isinstance(a, dict):
                assert a.keys() == b.keys() and torch.equal(a["param"], b["param"])
            else:
                assert torch.equal(a, b)


def _load_regular(rank, world, root, tag):
    engine = _engine(2, world)
    try:
        engine.load_checkpoint(root, tag=tag)
    except Exception as exc:  # noqa: BLE001 - the message is what the test checks
        return f"{type(exc).__name__}: {exc}"
    return None


def test_a_universal_folder_without_load_universal_names_the_key(converted):
    """A universal checkpoint loaded as a regular one fails naming checkpoint.load_universal
    (it has no per-rank optimizer states to read)."""
    message = run_ranks(_load_regular, 1, os.path.join(converted, "s2"), "t_universal")[0]
    assert message is not None and "checkpoint.load_universal" in message, message
    assert os.path.join(converted, "s2", "t_universal") in message, message

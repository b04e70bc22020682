"""Engine behaviour on Gloo ranks: loss scaling and overflow skips, the LR schedule, clipping
norm bookkeeping, accumulation boundaries, DeepSpeed's optimizer rules and clear errors."""

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from mlp import MLP
from multirank import free_port, run_ranks

HERE = pathlib.Path(__file__).parent


def _engine(config, **kwargs):
    import zerostream

    torch.manual_seed(0)
    model = MLP()
    return zerostream.initialize(model=model, config=config, **kwargs)


def _base(stage, **extra):
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": stage},
    }
    cfg.update(extra)
    return cfg


def overflow_and_schedule_worker(rank, world):
    """fp16 dynamic scaling with hysteresis 2 and a linear warmup schedule, at stage 2."""
    from zerostream.lr_schedules import WarmupLR

    cfg = _base(
        2,
        fp16={"enabled": True, "initial_scale_power": 8, "hysteresis": 2, "loss_scale_window": 100},
        scheduler={
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": 0.001,
                "warmup_max_lr": 0.01,
                "warmup_num_steps": 10,
                "warmup_type": "linear",
            },
        },
    )
    engine, opt, _, sched = _engine(cfg)
    assert engine.get_global_grad_norm() is None
    x = torch.randn(2, 8).half()
    trace = []
    for poison in (False, True, True, False):
        before = [p.detach().clone() for p in engine.module.parameters()]
        loss = engine(x)
        if poison:
            loss = loss * float("inf")
        engine.backward(loss)
        engine.step()
        changed = any(not torch.equal(b, p) for b, p in zip(before, engine.module.parameters()))
        trace.append(
            (
                engine.loss_scale(),
                engine.skipped_steps,
                engine.get_lr()[0],
                changed,
                engine.was_step_applied(),
                opt.overflow,
            )
        )
    # The same schedule on a plain optimizer, stepped once per applied step (two of four).
    ref_opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.01)
    ref = WarmupLR(
        ref_opt, warmup_min_lr=0.001, warmup_max_lr=0.01, warmup_num_steps=10, warmup_type="linear"
    )
    ref_lrs = []
    for applied in (True, False, False, True):
        if applied:
            ref.step()
        ref_lrs.append(ref_opt.param_groups[0]["lr"])
    return trace, ref_lrs, engine.global_steps, engine.global_samples


@pytest.mark.multirank
def test_fp16_overflow_skips_the_step_and_lowers_the_scale_with_hysteresis():
    trace, ref_lrs, steps, samples = run_ranks(overflow_and_schedule_worker, 2, timeout=120)[0]
    scales = [t[0] for t in trace]
    assert scales == [256.0, 256.0, 128.0, 128.0]  # hysteresis 2: the second overflow halves
    assert [t[1] for t in trace] == [0, 1, 2, 2]  # skipped_steps
    assert [t[3] for t in trace] == [True, False, False, True]  # params move only when applied
    assert [t[4] for t in trace] == [True, False, False, True]  # was_step_applied
    assert [t[5] for t in trace] == [False, True, True, False]  # optimizer.overflow
    assert [t[2] for t in trace] == pytest.approx(ref_lrs)  # no LR step on overflow
    assert steps == 4 and samples == 4 * 2 * 2


def accumulation_worker(rank, world):
    engine, *_ = _engine(_base(1, gradient_accumulation_steps=3))
    x = torch.randn(2, 8)
    boundaries, applied = [], []
    for _ in range(6):
        boundaries.append(engine.is_gradient_accumulation_boundary())
        engine.backward(engine(x))
        engine.step()
        applied.append(engine.was_step_applied())
    engine.set_gradient_accumulation_boundary(True)
    forced = engine.is_gradient_accumulation_boundary()
    errors = {}
    with engine.no_sync():
        engine.backward(engine(x))
        try:
            engine.step()
        except RuntimeError as exc:
            errors["step_in_no_sync"] = str(exc)
    stage2, *_ = _engine(_base(2))
    try:
        with stage2.no_sync():
            pass
    except ValueError as exc:
        errors["no_sync_stage2"] = str(exc)
        errors["no_sync_types"] = [
            type(exc).__name__,
            isinstance(exc, AssertionError),
            isinstance(exc, RuntimeError),
        ]
    return boundaries, applied, forced, engine.global_steps, errors


@pytest.mark.multirank
def test_accumulation_boundaries_and_no_sync():
    boundaries, applied, forced, steps, errors = run_ranks(accumulation_worker, 2)[0]
    assert boundaries == [False, False, True] * 2
    assert applied == [False, False, True] * 2
    assert forced is True and steps == 2
    assert "no step is allowed inside no_sync" in errors["step_in_no_sync"]
    # DeepSpeed's words and type too: its callers catch an AssertionError.
    assert "It is illegal to call Engine.step() inside no_sync" in errors["step_in_no_sync"]
    assert errors["no_sync_types"] == ["NoSyncError", True, True]
    assert "no_sync is not compatible with ZeRO stage 2" in errors["no_sync_stage2"]


def discarded_pass_worker(rank, world, stages):
    """A no_sync pass, zero_grad, then a real micro-step: the discarded pass must leave
    nothing behind (stage 1 keeps unreduced gradients in its own buffer, not in p.grad)."""
    from zerostream.utils import safe_get_full_grad

    xs = [
        torch.randn(2, 8, generator=torch.Generator().manual_seed(10 * rank + i)) for i in range(3)
    ]
    out = {}
    for stage, discard in ((stage, d) for stage in stages for d in (False, True)):
        engine, *_ = _engine(_base(stage))
        norms = []
        if discard:
            with engine.no_sync():
                for x in xs[:2]:
                    engine.backward(engine(x))
            engine.zero_grad()
        engine.backward(engine(xs[2]))
        norms.append(float(sum(safe_get_full_grad(p).norm() for p in engine.module.parameters())))
        engine.step()
        out[stage, discard] = (norms, [p.detach().clone() for p in engine.module.parameters()])
        engine.destroy()
    return out


@pytest.mark.multirank
def test_zero_grad_discards_what_a_no_sync_pass_accumulated():
    for out in run_ranks(discarded_pass_worker, 2, (0, 1)):
        for stage in (0, 1):
            (kept_norms, kept), (norms, params) = out[stage, False], out[stage, True]
            assert norms == kept_norms, stage
            for a, b in zip(params, kept):
                assert torch.equal(a, b), stage


def dying_rank_worker(rank, world):
    """Rank 1 is SIGKILLed in the middle of a step; rank 0 must fail fast and say why."""
    engine, *_ = _engine(_base(2))
    x = torch.randn(2, 8)
    engine.backward(engine(x))
    engine.step()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        for _ in range(3):
            engine.backward(engine(x))
            engine.step()
    except RuntimeError as exc:
        return ("error", str(exc), time.monotonic() - start)
    return ("no error", "", time.monotonic() - start)


@pytest.mark.multirank
def test_a_killed_rank_makes_the_others_fail_clearly_within_the_timeout():
    results = run_ranks(
        dying_rank_worker, 2, timeout=120, expect_failure=True, env={"DEEPSPEED_TIMEOUT": "0.5"}
    )
    status, payload = results[0]
    assert status == "ok", payload
    import io

    outcome, message, seconds = torch.load(io.BytesIO(payload), weights_only=False)
    assert outcome == "error"
    # Stage 2's bucket spans both ranks' partitions: it is reduce-scattered.
    assert re.match(r"\[rank 0\] (all_reduce|reduce_scatter_tensor) failed", message), message
    assert seconds < 60
    assert results[1][0] == "missing"  # the killed rank reported nothing


# Slow tier (CI's 25 minutes): the launcher's test_unchanged_deepspeed_script_trains_on_two_ranks
# runs the same unchanged script in the default tier.
@pytest.mark.slow
def test_a_deepspeed_script_runs_unchanged_under_torchrun(tmp_path):
    """examples-style script: argparse + add_config_arguments + initialize(args=...) +
    engine.backward/step, launched by torchrun with --deepspeed_config."""
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(
        '{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,'
        ' "optimizer": {"type": "Adam", "params": {"lr": 0.01}},'
        ' "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}},'
        ' "zero_optimization": {"stage": 2}, "steps_per_print": 1}'
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            str(HERE / "ds_style_script.py"),
            "--deepspeed",
            "--deepspeed_config",
            str(cfg),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [(tmp_path / f"out.{r}").read_text().split() for r in (0, 1)]
    # Each rank saw its own half of the data, yet both hold the same trained weights.
    assert lines[0][3] == lines[1][3], "ranks disagree on the trained weights"
    assert [line[4] for line in lines] == ["0", "1"], "args.local_rank must be each rank's own"
    steps, first, last = int(lines[0][0]), float(lines[0][1]), float(lines[0][2])
    assert steps == 4 and last < first  # 64 samples / (4 micro x 2 ranks) / 2 accumulation


def telemetry_worker(rank, world, nvme):
    import logging

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("zerostream").addHandler(Keep())
    cfg = _base(
        2,
        steps_per_print=2,
        zero_optimization={
            "stage": 2,
            "sub_group_size": 64,
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme, "pipeline_read": True},
        },
    )
    engine, opt, _, _ = _engine(cfg)
    x = torch.randn(2, 8)
    for _ in range(4):
        engine.backward(engine(x))
        engine.step()
    partition = sum(g["partition_numel"] for g in opt.state_summary()["groups"])
    return [r for r in records if r.startswith(("telemetry", "step="))], partition


@pytest.mark.multirank
def test_telemetry_reports_time_split_and_bytes_per_tier(tmp_path):
    lines, partition = run_ranks(telemetry_worker, 2, str(tmp_path))[0]
    tele = [line for line in lines if line.startswith("telemetry")]
    assert len(tele) == 2 and sum(line.startswith("step=") for line in lines) == 2
    for phase in ("forward", "backward", "reduce", "step", "swap_wait"):
        assert f"{phase} " in tele[0]
    # Each step reads and writes p, m, v (12 bytes per element) of this rank's partition.
    mib = 12 * partition / 2**20
    assert f"nvme_read {mib:.2f} MiB" in tele[0] and f"nvme_write {mib:.2f} MiB" in tele[0]
    # Stage 2's collectives by kind: the gradients' reduction, the updated partitions' gather.
    assert "all_gather " in tele[0] and "reduce_scatter " in tele[0] and "GB/s" in tele[0]


def scaling_modes_worker(rank, world):
    """Stage 0's pre-/post-division of gradients: three orders of the same average."""
    torch.manual_seed(100 + rank)  # each rank its own data
    xs = [torch.randn(2, 8) for _ in range(3)]
    out = {}
    for name, extra in (
        ("post", {}),
        ("prescale", {"prescale_gradients": True}),
        ("predivide", {"gradient_predivide_factor": 2.0}),
    ):
        engine, *_ = _engine(_base(0, **extra))
        for x in xs:
            engine.backward(engine(x))
            engine.step()
        out[name] = torch.cat([p.detach().flatten() for p in engine.module.parameters()])
    return out


@pytest.mark.multirank
def test_prescale_and_predivide_average_the_same_gradients():
    results = run_ranks(scaling_modes_worker, 2)
    for r in results:
        torch.testing.assert_close(r["prescale"], r["post"], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(r["predivide"], r["post"], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(results[0]["post"], results[1]["post"], rtol=0, atol=0)


def bf16_overflow_flag_worker(rank, world):
    """bf16.check_grad_overflow: true (default) skips a non-finite step; false lets it through,
    as DeepSpeed does."""
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("zerostream").addHandler(handler)
    out = {}
    for check in (True, False):
        records.clear()
        engine, *_ = _engine(_base(1, bf16={"enabled": True, "check_grad_overflow": check}))
        loss = engine(torch.randn(2, 8).bfloat16()) * float("inf")
        engine.backward(loss)
        engine.step()
        skips = [m for m in records if "skipped" in m]
        out[check] = (engine.was_step_applied(), engine.skipped_steps, skips)
    return out


@pytest.mark.multirank
def test_bf16_check_grad_overflow_is_honoured_and_a_skip_is_logged():
    out = run_ranks(bf16_overflow_flag_worker, 2)
    assert out[0][True][:2] == (False, 1)
    assert out[0][False] == (True, 0, [])
    # bf16 has no loss scaler to log the overflow, so the engine says why the step was skipped
    # (once, on rank 0).
    assert out[0][True][2] == [
        "step 1 skipped: the gradients hold inf or NaN (bf16 has no loss scale to lower); "
        "1 steps skipped so far"
    ]
    assert out[1][True][2] == []


def param_groups_worker(rank, world, use_callable):
    """Two param groups (weights decayed at lr 0.02, biases not at lr 0.005) through stage 2
    with a client optimizer given as a callable or as model_parameters + config."""
    import zerostream

    torch.manual_seed(0)
    model = MLP()
    groups = [
        {"params": [model.a.weight, model.b.weight], "weight_decay": 0.1, "lr": 0.02},
        {"params": [model.a.bias, model.b.bias], "weight_decay": 0.0, "lr": 0.005},
    ]
    cfg = {k: v for k, v in _base(2).items() if k != "optimizer"}
    if use_callable:
        engine, opt, _, _ = zerostream.initialize(
            model=model,
            model_parameters=groups,
            config=cfg,
            optimizer=lambda params: torch.optim.AdamW(params, lr=0.001),
        )
    else:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 0.001}}
        engine, opt, _, _ = zerostream.initialize(model=model, model_parameters=groups, config=cfg)
    torch.manual_seed(7)
    xs = torch.randn(3, world * 2, 8)
    for x in xs:
        engine.backward(engine(x[rank * 2 : (rank + 1) * 2]))
        engine.step()
    return [g["lr"] for g in opt.param_groups], {
        n: p.detach().clone() for n, p in engine.module.named_parameters()
    }


@pytest.mark.multirank
@pytest.mark.parametrize("use_callable", [True, False])
def test_param_groups_keep_their_options_under_zero(use_callable):
    lrs, params = run_ranks(param_groups_worker, 2, use_callable)[0]
    assert lrs == [0.02, 0.005]
    torch.manual_seed(0)
    model = MLP()
    ref = torch.optim.AdamW(
        [
            {"params": [model.a.weight, model.b.weight], "weight_decay": 0.1, "lr": 0.02},
            {"params": [model.a.bias, model.b.bias], "weight_decay": 0.0, "lr": 0.005},
        ],
        lr=0.001,
    )
    torch.manual_seed(7)
    for x in torch.randn(3, 4, 8):
        model(x).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        ref.step()
        ref.zero_grad()
    for name, p in model.named_parameters():
        torch.testing.assert_close(params[name], p.detach(), rtol=1e-5, atol=1e-6)


def client_instance_worker(rank, world):
    import zerostream

    torch.manual_seed(0)
    model = MLP()
    client = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cfg = {k: v for k, v in _base(0).items() if k != "optimizer"}
    engine, opt, _, _ = zerostream.initialize(model=model, optimizer=client, config=cfg)
    engine.backward(engine(torch.randn(2, 8)))
    engine.step()
    return opt is client, len(client.state) > 0  # returned bare, as DeepSpeed does


@pytest.mark.multirank
def test_a_client_optimizer_is_used_as_is_at_stage_0():
    same, has_state = run_ranks(client_instance_worker, 2)[0]
    assert same and has_state


def bad_nvme_path_worker(rank, world, path):
    try:
        _engine(
            _base(
                2,
                zero_optimization={
                    "stage": 2,
                    "offload_optimizer": {"device": "nvme", "nvme_path": path},
                },
            )
        )
    except OSError as exc:
        return str(exc)
    return "no error"


@pytest.mark.multirank
def test_an_unusable_nvme_path_names_the_key_and_the_path(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    message = run_ranks(bad_nvme_path_worker, 1, str(not_a_dir))[0]
    assert "zero_optimization.offload_optimizer.nvme_path" in message
    assert str(not_a_dir) in message and "Not a directory" in message


def optimizer_threads_worker(rank, world, threads):
    extra = {} if threads is None else {"zerostream": {"cpu_optimizer_threads": threads}}
    engine, opt, _, _ = _engine(
        _base(2, zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}}, **extra)
    )
    from zerostream.ops.threads import resolve

    inner = opt.optimizer
    return type(inner).__name__, inner.threads, resolve(inner.threads)[0]


@pytest.mark.multirank
@pytest.mark.slow  # CI's 25 minutes; the threads rule itself is unit-tested in tests/python/optim
def test_cpu_optimizer_threads_come_from_the_config_or_the_node_default():
    # 2 ranks on this node: the default shares the process's cores between them.
    name, threads, used = run_ranks(optimizer_threads_worker, 2, None)[0]
    assert name == "DeepSpeedCPUAdam" and threads is None
    assert used == max(1, len(os.sched_getaffinity(0)) // 2)
    name, threads, used = run_ranks(optimizer_threads_worker, 1, 3)[0]
    assert (threads, used) == (3, 3)

"""Accelerate with DeepSpeedPlugin(hf_ds_config=...) on zerostream: prepare, backward, step,
save_state/load_state, clip_grad_norm_ (the engine's norm), on 1 process at stage 2 (the
script's torch AdamW, which Accelerate swaps for DeepSpeedCPUAdam under offload) and on 2
Gloo processes at stage 3 (the config's optimizer, params and optimizer offloaded), where a
model is also loaded with from_pretrained under HfDeepSpeedConfig. Losses are compared with
plain PyTorch on the whole batch (accelerate_worker.py)."""

import json
import pathlib

import pytest
from compat_run import run_python

from multirank import free_port

HERE = pathlib.Path(__file__).resolve().parent
TOL = dict(rel=1e-4, abs=1e-5)  # the engine parity tests' tolerance


def run_accelerate(compat_env, tmp_path, nproc, stage):
    args = ["-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    args += [f"--master_port={free_port()}", str(HERE / "workers" / "accelerate_worker.py")]
    done = run_python(args + [str(tmp_path), str(stage)], compat_env, timeout=420, cwd=HERE)
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def check_training(facts, nproc):
    assert facts["num_processes"] == nproc and facts["same_data"]
    assert facts["engine"] == "ZeroEngine"
    assert facts["optimizer_wrapper"] == "DeepSpeedOptimizerWrapper"
    assert facts["inner_optimizer"] == "DeepSpeedCPUAdam"
    assert facts["step_was_skipped"] is False
    assert facts["losses"] == pytest.approx(facts["reference"], **TOL)
    # Steps 3-4 again from the state saved after step 2: weights and optimizer restored.
    assert facts["after_load_state"] == pytest.approx(facts["losses"][2:], **TOL)
    assert facts["grad_norm"] == pytest.approx(facts["reference_grad_norms"][-1], **TOL)
    assert "pytorch_model" in facts["saved"] and "latest" in facts["saved"]
    assert [f"random_states_{r}.pkl" in facts["saved"] for r in range(nproc)] == [True] * nproc


@pytest.mark.slow  # the two-process stage-3 case below runs Accelerate's path in the default tier
def test_accelerate_one_process_stage2_offload(compat_env, tmp_path):
    check_training(run_accelerate(compat_env, tmp_path, 1, 2), 1)


@pytest.mark.multirank
def test_accelerate_two_processes_stage3_offload_and_zero3_from_pretrained(compat_env, tmp_path):
    facts = run_accelerate(compat_env, tmp_path, 2, 3)
    check_training(facts, 2)
    loaded = facts["from_pretrained"]
    # Built under zero.Init (every param partitioned), weights equal to the plain load.
    assert loaded["partitioned"] and loaded["keys_equal"]
    assert loaded["max_diff"] == 0.0 and loaded["dtype"] == "torch.float32"


def test_accelerate_launch_use_deepspeed_on_two_cpu_processes(compat_env, tmp_path):
    """`accelerate launch --use_deepspeed --zero_stage 2 --num_processes 2` on a CPU machine,
    with docs/compat.md's recipe (InitProcessGroupKwargs(backend="gloo")): both processes
    train through the engine, to plain PyTorch's weights on the whole batch."""
    import torch

    args = ["-m", "accelerate.commands.accelerate_cli", "launch", "--use_deepspeed"]
    args += ["--zero_stage", "2", "--num_processes", "2", "--num_machines", "1"]
    args += ["--mixed_precision", "no", "--gradient_accumulation_steps", "1"]
    args += ["--main_process_port", str(free_port())]
    args += [str(HERE / "workers" / "accelerate_launch_worker.py")]
    done = run_python(args, compat_env, timeout=300, cwd=tmp_path)
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    facts = json.loads(line[len("RESULT ") :])
    assert facts["processes"] == 2 and facts["engine"] == "ZeroEngine"

    import sys

    sys.path.insert(0, str(HERE / "workers"))
    from accelerate_launch_worker import PER_RANK, STEPS, dataset

    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.0)
    x, y = dataset()
    for step in range(STEPS):
        rows = slice(step * 2 * PER_RANK, (step + 1) * 2 * PER_RANK)  # both ranks' batches
        torch.nn.functional.mse_loss(ref(x[rows]), y[rows]).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)  # the plugin's gradient_clipping
        opt.step()
        opt.zero_grad()
    for got, want in zip(facts["weights"], ref.parameters()):
        assert got == pytest.approx(want.detach().flatten().tolist(), **TOL)

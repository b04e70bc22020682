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

"""Hugging Face Trainer with `TrainingArguments(deepspeed=config)` on zerostream, "auto"
values filled by Trainer: a tiny GPT-2 (tied embedding) and a tiny Llama at stages 1, 2 and 3
with offload_optimizer cpu and nvme (and offload_param cpu/nvme at stage 3) log the same loss
at every step as plain Trainer (no DeepSpeed) from the same weights and data; save_model()
writes the weights plain Trainer ends with, and resume_from_checkpoint retrains steps 2-3
identically (trainer_worker.py, one process with a launcher's environment); and on 2
processes at stage 3 the same losses as the single-process run (trainer_ranks_worker.py)."""

import json
import pathlib

import pytest
import torch
from compat_run import run_python

from multirank import free_port

HERE = pathlib.Path(__file__).resolve().parent
TOL = dict(rel=1e-4, abs=1e-5)  # the engine parity tests' tolerance
MODELS = ("gpt2", "llama")


# (name suffix, stage, offload_optimizer, offload_param, the config has an "optimizer"
# section; without one Trainer's own AdamW is used and Accelerate swaps in DeepSpeedCPUAdam).
GRID = [
    ("s1_cpu", 1, "cpu", "none", False),
    ("s1_nvme", 1, "nvme", "none", True),
    ("s2_cpu", 2, "cpu", "none", True),
    ("s2_nvme", 2, "nvme", "none", True),
    ("s3_cpu", 3, "cpu", "cpu", False),
    ("s3_nvme", 3, "nvme", "nvme", True),
]


def _cases():
    cases = [
        dict(
            name=f"{m}_{suffix}",
            model=m,
            stage=stage,
            offload_optimizer=opt,
            offload_param=param,
            extra={"config_optimizer": cfg_opt},
        )
        for m in MODELS
        for suffix, stage, opt, param, cfg_opt in GRID
    ]
    # save_model / resume: GPT-2 at stage 2, Llama at stage 3.
    next(c for c in cases if c["name"] == "gpt2_s2_cpu")["save_resume"] = True
    next(c for c in cases if c["name"] == "llama_s3_cpu")["save_resume"] = True
    # DeepSpeed's scheduler section with every value "auto".
    auto = dict(type="WarmupDecayLR", params=dict(warmup_min_lr="auto", warmup_max_lr="auto"))
    auto["params"].update(warmup_num_steps="auto", total_num_steps="auto")
    cases.append(
        dict(
            name="gpt2_s1_sched",
            model="gpt2",
            stage=1,
            offload_optimizer="none",
            extra={"config_optimizer": True, "scheduler": auto},
        )
    )
    return cases


CASES = _cases()
PARITY = [c["name"] for c in CASES if "scheduler" not in c["extra"]]


@pytest.fixture(scope="module")
def runs(compat_env, tmp_path_factory):
    out = tmp_path_factory.mktemp("trainer")
    spec = out / "spec.json"
    spec.write_text(json.dumps({"out": str(out), "cases": CASES}))
    env = dict(compat_env, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    done = run_python(
        [str(HERE / "workers" / "trainer_worker.py"), str(spec)], env, timeout=600, cwd=HERE
    )
    return out, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", PARITY)
def test_trainer_with_deepspeed_logs_plain_trainers_losses(runs, name):
    _, result = runs
    case = next(c for c in CASES if c["name"] == name)
    run, plain = result[name], result[f"plain_{case['model']}"]
    assert len(plain["losses"]) == 3
    assert run["losses"] == pytest.approx(plain["losses"], **TOL)
    assert run["engine"] == "ZeroEngine" and run["stage"] == case["stage"]
    assert run["offload_optimizer"] == case["offload_optimizer"]
    assert run["offload_param"] == case["offload_param"]
    if case["offload_optimizer"] == "cpu":
        assert run["inner_optimizer"] == "DeepSpeedCPUAdam"
    else:
        assert run["nvme_files"] > 0  # the optimizer state (and stage-3 params) on disk
    auto = run["auto_filled"]  # from TrainingArguments and the model's hidden size (32)
    assert (auto["micro"], auto["gas"], auto["train_batch_size"]) == (4, 2, 8)
    assert auto["clipping"] == 1.0 and auto["reduce_bucket_size"] == 32 * 32
    if case["stage"] == 3:
        assert auto["persistence"] == 10 * 32


@pytest.mark.parametrize("name", ["gpt2_s2_cpu", "llama_s3_cpu"])
def test_save_model_and_resume_from_checkpoint(runs, name):
    out, result = runs
    run = result[name]
    model = name.split("_")[0]
    assert run["checkpoints"] == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    for f in ("global_step1", "latest", "zero_to_fp32.py", "trainer_state.json"):
        assert f in run["checkpoint_files"]
    # checkpoint-1 logged one loss; the resumed run trained and logged steps 2 and 3.
    assert run["resumed_global_step"] == 3
    assert run["resumed_losses"] == pytest.approx(run["losses"], **TOL)
    assert "model.safetensors" in run["saved_files"]
    saved = torch.load(out / name / "saved_weights.pt")
    final = torch.load(out / f"plain_{model}" / "final_weights.pt")
    assert sorted(saved) == sorted(final)
    for key, value in final.items():
        torch.testing.assert_close(saved[key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_deepspeed_scheduler_section_with_auto_values(runs):
    _, result = runs
    run = result["gpt2_s1_sched"]
    assert run["scheduler"] == "WarmupDecayLR"
    params = run["scheduler_params"]
    assert params["total_num_steps"] == 3 and params["warmup_num_steps"] >= 1
    assert params["max_lrs"] == [pytest.approx(1e-3)] and params["min_lrs"] == [0]
    assert all(loss == loss and loss > 0 for loss in run["losses"])


@pytest.mark.multirank
def test_trainer_on_two_processes_stage3_logs_the_single_process_losses(runs, compat_env):
    """2 Gloo processes x micro-batch 4 at stage 3 (params and optimizer offloaded): the
    global batches of the single-process plain run (4 x 2 accumulation steps), the same
    losses. Needs the process state configured by the script (trainer_ranks_worker.py)."""
    out, result = runs
    args = ["-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}"]
    args += [str(HERE / "workers" / "trainer_ranks_worker.py"), str(out / "two_processes")]
    done = run_python(args, compat_env, timeout=420, cwd=HERE)
    facts = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert facts["world"] == facts["num_processes"] == facts["dp_world_size"] == 2
    assert facts["stage"] == 3 and facts["train_batch_size"] == 8
    assert facts["losses"] == pytest.approx(result["plain_gpt2"]["losses"], **TOL)

"""The calls DeepSpeed's cifar10_deepspeed.py and small_model_debugging/test_model.py make,
through `import deepspeed`, on 2 ranks started by torch.distributed.run: stages 0-3 (CIFAR
style: "Adam" + WarmupLR + clipping, initialize's own dataloader, the MoE param-group helper)
and 0-2 (test_model style: config file in args, shared Linear, 20-element reduce buckets).
Every step's loss equals plain PyTorch on the union of the ranks' batches
(ds_scripts_worker.py)."""

import json
import pathlib

import pytest
from compat_run import run_python

from multirank import free_port

HERE = pathlib.Path(__file__).resolve().parent


@pytest.mark.multirank
def test_deepspeed_example_calls_train_like_plain_pytorch(compat_env, tmp_path):
    args = ["-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}"]
    args += [
        str(HERE / "workers" / "ds_scripts_worker.py"),
        "--out",
        str(tmp_path),
        "--moe-param-group",
    ]
    done = run_python(args, compat_env, timeout=420, cwd=HERE)
    out = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert out["world"] == 2 and out["args_local_rank"] == 0
    cases = [f"cifar_stage{s}" for s in range(4)] + [f"test_model_stage{s}" for s in range(3)]
    for case in cases:
        run = out[case]
        assert run["steps"] == 4, case
        assert run["losses"] == pytest.approx(run["reference"], rel=1e-5, abs=1e-6), case

"""bf16.bf16_master_weights_and_grads + bf16.bf16_optimizer_states (DeepSpeed >= 0.18.3)
without an offloaded optimizer: the master weights, their gradients and Adam's moments are
bf16, as DeepSpeed keeps them, at ZeRO stages 1-3 on 2 Gloo ranks.

- The math: plain PyTorch AdamW stepping a bf16 model's own parameters (bf16 moments) on the
  whole batch; the bound is bf16 rounding (per-rank gradients summed across ranks), the same
  2e-2 as the other bf16 parity tests, and the run must differ from the fp32-master run.
- The mechanism: masters, gradient partitions and moments are bf16 and 1/world of the model.
- A checkpoint resumes bitwise; DeepSpeed's own example config of the feature trains.
"""

import json
import pathlib

import pytest
import torch

from multirank import run_ranks
from tiny_gpt import TinyGPT, adamw_ds_config, plain_adamw_losses, train_data_parallel

STEPS, GLOBAL_BATCH = 4, 16
LR, BETAS, WD, CLIP = 1e-2, (0.9, 0.95), 0.01, 0.5
EXAMPLE = (
    pathlib.Path(__file__).resolve().parents[3].parent
    / "shared/compat/configs"
    / "deepspeedai__DeepSpeedExamples__training__bf16_master_weight__configs__bf16_full.json"
)


def _config(micro, stage, master=True):
    bf16 = {"enabled": True}
    if master:
        bf16.update(bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
    zero = {"stage": stage, "reduce_bucket_size": 3000}
    return adamw_ds_config(micro, zero, LR, BETAS, WD, CLIP, bf16=bf16)


def _train(engine, rank, world, steps, first=0):
    return train_data_parallel(engine, rank, world, steps, GLOBAL_BATCH, first)


def worker(rank, world, stages, root):
    import zerostream

    micro = GLOBAL_BATCH // world
    out = {}
    for stage in stages:
        for master in (True, False):
            torch.manual_seed(0)
            engine = zerostream.initialize(model=TinyGPT(), config=_config(micro, stage, master))[0]
            losses = _train(engine, rank, world, STEPS)
            opt = engine.optimizer
            state = [opt.optimizer.state[m] for m in opt.masters]
            out[(stage, master)] = {
                "losses": losses,
                "master_dtypes": {str(m.dtype) for m in opt.masters},
                "grad_dtypes": {str(g.dtype) for g in opt.grads},
                "moment_dtypes": {
                    str(st[k].dtype) for st in state for k in ("exp_avg", "exp_avg_sq")
                },
                "master_numel": sum(m.numel() for m in opt.masters),
                "model_numel": sum(
                    p.ds_numel if hasattr(p, "ds_numel") else p.numel()
                    for p in engine.module.parameters()
                ),
            }
            engine.destroy()
    return out


def test_bf16_masters_gradients_and_moments_train_like_plain_pytorch_bf16(tmp_path):
    ranks = run_ranks(worker, 2, (1, 2, 3), str(tmp_path))
    # Plain PyTorch: AdamW on a bf16 model's own parameters (bf16 moments), whole batch.
    ref = plain_adamw_losses(STEPS, GLOBAL_BATCH, LR, BETAS, WD, CLIP, torch.bfloat16)
    for out in ranks:
        for stage in (1, 2, 3):
            run, fp32_master = out[(stage, True)], out[(stage, False)]
            assert run["master_dtypes"] == {"torch.bfloat16"}, stage
            assert run["grad_dtypes"] == {"torch.bfloat16"}, stage
            assert run["moment_dtypes"] == {"torch.bfloat16"}, stage
            assert fp32_master["master_dtypes"] == {"torch.float32"}
            assert fp32_master["moment_dtypes"] == {"torch.float32"}
            # Partitioned: this rank holds about half of the model's elements.
            assert run["master_numel"] <= run["model_numel"] // 2 + 64, stage
            assert run["losses"] == pytest.approx(ref, rel=2e-2), stage
            assert run["losses"] != fp32_master["losses"], stage  # the key changed the math


def resume_worker(rank, world, root):
    import zerostream

    micro = GLOBAL_BATCH // world

    def engine_for():
        torch.manual_seed(0)
        return zerostream.initialize(model=TinyGPT(), config=_config(micro, 3))[0]

    engine = engine_for()
    whole = _train(engine, rank, world, STEPS)
    engine.destroy()
    engine = engine_for()
    _train(engine, rank, world, 2)
    engine.save_checkpoint(f"{root}/ckpt", tag="half")
    engine.destroy()
    engine = engine_for()
    engine.load_checkpoint(f"{root}/ckpt", tag="half")
    resumed = _train(engine, rank, world, STEPS - 2, first=2)
    engine.destroy()
    return whole, resumed


def test_a_bf16_master_checkpoint_resumes_bitwise(tmp_path):
    for whole, resumed in run_ranks(resume_worker, 2, str(tmp_path)):
        assert resumed == whole[2:]


def example_worker(rank, world, path):
    import zerostream

    config = json.loads(pathlib.Path(path).read_text())
    config["train_micro_batch_size_per_gpu"] = GLOBAL_BATCH // world
    torch.manual_seed(0)
    engine = zerostream.initialize(model=TinyGPT(), config=config)[0]
    losses = _train(engine, rank, world, STEPS)
    opt = engine.optimizer
    dtypes = {str(t.dtype) for t in opt.masters + opt.grads}
    dtypes |= {
        str(v.dtype) for m in opt.masters for v in opt.optimizer.state[m].values() if v.dim()
    }
    engine.destroy()
    return losses, dtypes


def test_deepspeeds_bf16_master_example_config_trains_with_bf16_state():
    """DeepSpeedExamples' training/bf16_master_weight/configs/bf16_full.json (stage 3, both
    keys on), read from shared/compat: masters, gradients and moments bf16, finite losses."""
    losses, dtypes = run_ranks(example_worker, 2, str(EXAMPLE))[0]
    assert dtypes == {"torch.bfloat16"}
    assert all(torch.isfinite(torch.tensor(losses)))

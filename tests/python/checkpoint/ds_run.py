"""DeepSpeed's side of the migration tests, run with the DeepSpeed environment's python
(.venv-deepspeed from scripts/deepspeed-peer.sh, or .venv-bench), never imported by pytest:

    python ds_run.py ROOT WORLD CASES_JSON [universal]

starts WORLD ranks (Gloo, DeepSpeed's CPU accelerator). Each rank, for every case
(stage, dtype): builds the TinyGPT of ckpt_run.py from seed 0, trains K steps with
deepspeed.initialize, saves a checkpoint to ROOT/ds<WORLD>/<stage>-<dtype>, trains K more
steps (DeepSpeed's own continuation), then loads the checkpoint into a fresh engine and
trains the same K steps again (DeepSpeed's resume). Rank 0 writes ROOT/ds<WORLD>.json:
{case id: {"first", "rest", "resumed": losses, "lr", "scale", "step": at the save,
"scale_end": after "rest"}},
where "resumed" are the K steps a fresh DeepSpeed engine trains after loading the checkpoint
(or the error DeepSpeed raised loading it).

The model, batches, optimizer and schedule are ckpt_run.py's (so zerostream can continue the
same run); only torch_adam is added, so DeepSpeed needs no JIT-built optimizer op.
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

GLOBAL_BATCH = 8
K = 3


def case_id(case) -> str:
    return "-".join(str(c) for c in case if c != "")


# Settings that change how DeepSpeed lays out or pickles its optimizer state, on top of a
# case's stage and dtype.
VARIANTS = {
    "": {},
    "rr": {"zero_optimization": {"round_robin_gradients": True}},
    "sub": {"zero_optimization": {"sub_group_size": 2000}},
    "align": {"zero_optimization": {"parameter_alignment": True}},
    "elastic": {"zero_optimization": {"elastic_checkpoint": True}},
    "bf16opt": {"data_types": {"grad_accum_dtype": "fp32"}},
    "offload": {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
}


def config(stage: int, dtype: str, world: int, variant: str = "") -> dict:
    """The ds_config of a case (zerostream continues with the same one)."""
    cfg = {
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.5,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 1e-2, "weight_decay": 0.01, "torch_adam": variant != "offload"},
        },
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 6}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000},
        "bf16": {"enabled": dtype == "bf16"},
        "fp16": {"enabled": dtype == "fp16", "initial_scale_power": 8, "loss_scale_window": 2},
        "steps_per_print": 1000,
    }
    for section, values in VARIANTS[variant].items():
        cfg[section] = {**cfg.get(section, {}), **values}
    return cfg


def train(engine, rank, world, xs, ys, first, count):
    import torch.distributed as dist

    micro = GLOBAL_BATCH // world
    rows = slice(rank * micro, (rank + 1) * micro)
    losses = []
    for s in range(first, first + count):
        loss = engine(xs[s][rows], ys[s][rows])
        engine.backward(loss)
        engine.step()
        value = loss.detach().float().reshape(1)
        if world > 1:
            dist.all_reduce(value)
        losses.append(float(value) / world)
    return losses


def scale_and_step(engine):
    """DeepSpeed's loss scale and its inner optimizer's step count (read from its objects:
    the ZeRO optimizers keep a loss_scaler, the stage-0 FP16 wrappers a loss_scale_config)."""
    opt = engine.optimizer
    scale = None
    for owner in (getattr(opt, "loss_scaler", None), getattr(opt, "loss_scale_config", None)):
        if owner is not None and hasattr(owner, "cur_scale"):
            scale = float(owner.cur_scale)
            break
    inner = getattr(opt, "optimizer", opt)
    steps = [float(st["step"]) for st in inner.state.values() if "step" in st]
    return scale, (steps[0] if steps else None)


def rank_main(root: str, world: int, cases) -> None:
    import deepspeed
    import torch

    from tiny_gpt import TinyGPT, make_batches

    torch.set_num_threads(1)
    # DeepSpeed's CPU backend JIT-builds its shared-memory all-reduce op (about a minute on
    # 2 cores in a fresh CI cache) only to speed up inference collectives; the checkpoint
    # files these runs write do not depend on it, so Gloo alone does the reductions.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    rank = int(os.environ["RANK"])
    xs, ys = make_batches(4 * K, GLOBAL_BATCH)
    out = {}
    if any(dtype == "fp16" for _, dtype, _ in cases):
        # DeepSpeed's CPU accelerator refuses fp16 unless oneDNN has fp16 kernels; torch
        # runs fp16 on any CPU, so the check is lifted to get DeepSpeed's fp16 files.
        from deepspeed.accelerator import get_accelerator

        get_accelerator().is_fp16_supported = lambda: True
    for stage, dtype, variant in cases:
        case = (stage, dtype, variant)
        torch.manual_seed(0)
        model = TinyGPT()
        cfg = config(stage, dtype, world, variant)
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=cfg
        )
        first = train(engine, rank, world, xs, ys, 0, K)
        ckpt = os.path.join(root, f"ds{world}", case_id(case))
        engine.save_checkpoint(ckpt, client_state={"resume_at": K})
        lr = engine.get_lr()[0]
        scale, step = scale_and_step(engine)
        rest = train(engine, rank, world, xs, ys, K, K)
        scale_end, _ = scale_and_step(engine)
        engine.destroy()
        # DeepSpeed's own resume: a fresh engine from other weights loads the checkpoint.
        torch.manual_seed(1)
        model = TinyGPT()
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=cfg
        )
        try:
            engine.load_checkpoint(ckpt)
            resumed = train(engine, rank, world, xs, ys, K, K)
        except Exception as exc:  # DeepSpeed cannot always read its own files
            resumed = f"{type(exc).__name__}: {exc}"
        engine.destroy()
        out[case_id(case)] = {
            "first": first,
            "rest": rest,
            "resumed": resumed,
            "lr": lr,
            "scale": scale,
            "scale_end": scale_end,
            "step": step,
        }
    if rank == 0:
        with open(os.path.join(root, f"ds{world}.json"), "w") as f:
            json.dump(out, f)


def launch(root: str, world: int, cases_json: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(world):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            DS_ACCELERATOR="cpu",
            OMP_NUM_THREADS="1",
            ZS_DS_RANK="1",
        )
        argv = [sys.executable, __file__, root, str(world), cases_json]
        procs.append(subprocess.Popen(argv, env=env))
    codes = [p.wait() for p in procs]
    # DeepSpeed's CPU all-reduce never unlinks its 69 MB /dev/shm segment per rank
    # (zerostream.bench.remove_deepspeed_shm does the same for bench step; this python is
    # DeepSpeed's environment, which has no zerostream).
    for r in range(world):
        name = f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_{r}"
        if os.path.exists(name):
            os.unlink(name)
    return max(codes, key=abs)


def universal(root: str, world: int, cases) -> None:
    """DeepSpeed's own per-parameter views of each ZeRO checkpoint: its zero_to_fp32 writes
    ROOT/uni<WORLD>/<case>.fp32.pt, ds_to_universal ROOT/uni<WORLD>/<case>/zero/<param>/
    {fp32,exp_avg,exp_avg_sq,step}.pt. Where a tool fails, ROOT/uni<WORLD>/<case>.error
    (ds_to_universal) or <case>.fp32.error (zero_to_fp32) holds the reason."""
    import torch
    from deepspeed.checkpoint import ds_to_universal
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    for case in cases:
        if case[0] == 0:
            continue
        src = os.path.join(root, f"ds{world}", case_id(case), f"global_step{K}")
        dst = os.path.join(root, f"uni{world}", case_id(case))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            fp32 = get_fp32_state_dict_from_zero_checkpoint(os.path.dirname(src))
            torch.save({k: v.clone() for k, v in fp32.items()}, dst + ".fp32.pt")
        except Exception as exc:  # its BF16_Optimizer files have no zero_stage
            with open(dst + ".fp32.error", "w") as f:
                f.write(f"{type(exc).__name__}: {exc}")
        argv = ["--input_folder", src, "--output_folder", dst, "--inject_missing_state"]
        argv += ["--num_extract_workers", "1", "--num_merge_workers", "1"]
        sys.argv = ["ds_to_universal"] + argv
        try:
            ds_to_universal.main(ds_to_universal.parse_arguments())
        except BaseException as exc:  # noqa: BLE001 - recorded for the test to report
            with open(dst + ".error", "w") as f:
                f.write(f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    root_, world_, cases_ = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if len(sys.argv) > 4 and sys.argv[4] == "universal":
        universal(root_, world_, [(c + [""])[:3] for c in json.loads(cases_)])
    elif os.environ.get("ZS_DS_RANK"):
        rank_main(root_, world_, [(c + [""])[:3] for c in json.loads(cases_)])
    else:
        sys.exit(launch(root_, world_, cases_))

"""Hugging Face Trainer runs, plain and with `TrainingArguments(deepspeed=...)` (run by
test_trainer.py in one subprocess with a launcher's environment: RANK, LOCAL_RANK, ...).

argv: a JSON file {"out": dir, "cases": [...]}; prints one JSON object with, per case, the
logged loss of every optimizer step and what the case checks afterwards."""

import json
import os
import shutil
import sys

import torch
from hf_models import BATCH, GAS, LR, STEPS, TokenData, ds_config, make_model
from transformers import Trainer, TrainingArguments


def arguments(out_dir, deepspeed=None, **overrides):
    kwargs = dict(
        output_dir=out_dir,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=GAS,
        max_steps=STEPS,
        learning_rate=LR,
        lr_scheduler_type="linear",
        warmup_steps=1,
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
        deepspeed=deepspeed,
    )
    kwargs.update(overrides)
    return TrainingArguments(**kwargs)


def losses_of(trainer):
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def initial_weights(kind):
    return {k: v.clone() for k, v in make_model(kind).state_dict().items()}


def fresh_model(kind, initial):
    model = make_model(kind, seed=1)  # other random values, replaced by the same initial ones
    model.load_state_dict(initial)
    return model


def plain(kind, initial, out_dir):
    trainer = Trainer(
        model=fresh_model(kind, initial),
        args=arguments(out_dir),
        train_dataset=TokenData(STEPS * GAS * BATCH),
    )
    trainer.train()
    weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    return {"losses": losses_of(trainer)}, weights


def with_deepspeed(case, initial, out_dir):
    nvme = os.path.join(out_dir, "nvme")
    cfg = ds_config(
        case["stage"],
        case["offload_optimizer"],
        case.get("offload_param", "none"),
        nvme,
        **case.get("extra", {}),
    )
    save = case.get("save_resume", False)
    overrides = dict(save_strategy="steps", save_steps=1) if save else {}
    args = arguments(out_dir, deepspeed=cfg, **overrides)
    trainer = Trainer(
        model=fresh_model(case["model"], initial),
        args=args,
        train_dataset=TokenData(STEPS * GAS * BATCH),
    )
    trainer.train()
    engine = trainer.model_wrapped
    resolved = engine._config
    result = {
        "losses": losses_of(trainer),
        "engine": type(engine).__name__,
        "stage": engine.zero_optimization_stage(),
        "offload_optimizer": resolved.zero_optimization.offload_optimizer_device,
        "offload_param": resolved.zero_optimization.offload_param_device,
        "inner_optimizer": type(engine.basic_optimizer).__name__,
        "auto_filled": {
            "train_batch_size": resolved.train_batch_size,
            "micro": resolved.train_micro_batch_size_per_gpu,
            "gas": resolved.gradient_accumulation_steps,
            "clipping": resolved.gradient_clipping,
            "reduce_bucket_size": resolved.zero_optimization.reduce_bucket_size,
            "persistence": resolved.zero_optimization.stage3_param_persistence_threshold,
        },
        "scheduler": type(engine.lr_scheduler).__name__,
    }
    sched = engine.lr_scheduler
    if hasattr(sched, "total_num_steps"):  # DeepSpeed's WarmupDecayLR, "auto" filled
        result["scheduler_params"] = {
            "total_num_steps": sched.total_num_steps,
            "warmup_num_steps": sched.warmup_num_steps,
            "max_lrs": sched.max_lrs,
            "min_lrs": sched.min_lrs,
        }
    if case["stage"] > 0 and case["offload_optimizer"] == "nvme":
        result["nvme_files"] = sum(len(f) for _, _, f in os.walk(nvme))
    if save:
        result.update(save_and_resume(case, initial, trainer, cfg, out_dir))
    engine.destroy()
    return result


def save_and_resume(case, initial, trainer, cfg, out_dir):
    """save_model() writes weights from_pretrained loads; resuming from the step-1
    checkpoint (model, ZeRO optimizer state, scheduler, RNG) retrains steps 2 and 3."""
    from transformers import AutoModelForCausalLM

    saved_dir = os.path.join(out_dir, "saved")
    trainer.save_model(saved_dir)
    reloaded = AutoModelForCausalLM.from_pretrained(saved_dir)
    saved = {k: v.detach().clone() for k, v in reloaded.state_dict().items()}
    torch.save(saved, os.path.join(out_dir, "saved_weights.pt"))
    ckpts = sorted(d for d in os.listdir(out_dir) if d.startswith("checkpoint-"))
    for later in ckpts[1:]:  # resume=True takes the newest: keep only checkpoint-1
        shutil.rmtree(os.path.join(out_dir, later))
    resumed = Trainer(
        model=fresh_model(case["model"], initial),
        args=arguments(out_dir, deepspeed=cfg),
        train_dataset=TokenData(STEPS * GAS * BATCH),
    )
    resumed.train(resume_from_checkpoint=True)
    resumed.model_wrapped.destroy()
    return {
        "checkpoints": ckpts,
        "checkpoint_files": sorted(os.listdir(os.path.join(out_dir, ckpts[0]))),
        "resumed_losses": losses_of(resumed),
        "resumed_global_step": resumed.state.global_step,
        "saved_files": sorted(os.listdir(saved_dir)),
    }


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    out = {}
    weights = {}
    models = sorted({c["model"] for c in spec["cases"]})
    initial = {kind: initial_weights(kind) for kind in models}
    # Plain Trainer first: no DeepSpeed config object exists yet in this process.
    for kind in models:
        d = os.path.join(spec["out"], f"plain_{kind}")
        out[f"plain_{kind}"], weights[kind] = plain(kind, initial[kind], d)
        torch.save(weights[kind], os.path.join(d, "final_weights.pt"))
    for case in spec["cases"]:
        d = os.path.join(spec["out"], case["name"])
        out[case["name"]] = with_deepspeed(case, initial[case["model"]], d)
        nvme = os.path.join(d, "nvme")
        if os.path.isdir(nvme):
            shutil.rmtree(nvme)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

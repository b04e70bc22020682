"""Accelerate with `Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=...))`, run by
test_accelerate.py under torch.distributed.run (1 or 2 processes, Gloo).

argv: out_dir stage. Rank 0 prints one JSON object: the losses of 4 optimizer steps, of the
same 4 steps trained by plain PyTorch on the whole batch, and of steps 3-4 again after
load_state() of the state saved after step 2. With stage 3 it also loads a saved model with
from_pretrained under HfDeepSpeedConfig (zero.Init + GatheredParameters) and reports the
largest difference to a plain load."""

import json
import os
import sys

import torch
from hf_models import BATCH, LR, TokenData, make_model

STEPS = 4


def ds_config(stage, nvme):
    zero = {"stage": stage, "offload_optimizer": {"device": "cpu"}}
    if stage == 3:
        zero["offload_param"] = {"device": "cpu"}
        zero["stage3_param_persistence_threshold"] = 0
    cfg = {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
    }
    if stage == 3:  # the config's optimizer (DummyOptim); stage 2 uses the script's AdamW
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}}
    return cfg


def batches(world):
    """STEPS global batches of world * BATCH sequences; process r takes rows r*BATCH..."""
    data = TokenData(STEPS * world * BATCH).ids
    return data.view(STEPS, world * BATCH, -1)


def reference(initial, world):
    model = make_model("gpt2")
    model.load_state_dict(initial)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses, norms = [], []
    for ids in batches(world):
        # The mean of per-process mean losses (equal micro-batches), as the engine averages.
        loss = sum(model(input_ids=h, labels=h).loss for h in ids.chunk(world)) / world
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses, norms


def mean_over_processes(accelerator, loss):
    return float(accelerator.gather(loss.detach().reshape(1)).mean())


def train(accelerator, stage, initial, out_dir):
    from accelerate.utils import DummyOptim

    model = make_model("gpt2")
    model.load_state_dict(initial)
    if stage == 3:
        optimizer = DummyOptim(model.parameters(), lr=LR, weight_decay=0.0)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    world, rank = accelerator.num_processes, accelerator.process_index
    loader = torch.utils.data.DataLoader(TokenData(STEPS * world * BATCH), batch_size=BATCH)
    engine, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    mine = [b["input_ids"] for b in loader]
    expected = [ids[rank * BATCH : (rank + 1) * BATCH] for ids in batches(world)]
    same_data = len(mine) == len(expected) and all(map(torch.equal, mine, expected))

    def step(ids):
        loss = engine(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        optimizer.step()  # no-ops under DeepSpeed: accelerator.backward stepped the engine
        optimizer.zero_grad()
        return mean_over_processes(accelerator, loss)

    losses = [step(ids) for ids in mine[:2]]
    state_dir = os.path.join(out_dir, "state")
    accelerator.save_state(state_dir)
    losses += [step(ids) for ids in mine[2:]]
    accelerator.load_state(state_dir)
    again = [step(ids) for ids in mine[2:]]
    facts = {
        "losses": losses,
        "after_load_state": again,
        "same_data": same_data,
        "engine": type(engine).__name__,
        "optimizer_wrapper": type(optimizer).__name__,
        "inner_optimizer": type(engine.basic_optimizer).__name__,
        "step_was_skipped": optimizer.step_was_skipped,
        "grad_norm": accelerator.clip_grad_norm_(engine.parameters(), 1.0),
        "saved": sorted(os.listdir(state_dir)),
        "num_processes": world,
    }
    engine.destroy()
    return facts


def zero3_from_pretrained(out_dir, accelerator):
    """A model saved with save_pretrained, loaded under HfDeepSpeedConfig at stage 3."""
    import deepspeed
    from transformers import AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    # The stage-3 plugin above made transformers build models under zero.Init; the plain
    # load must not.
    unset_hf_deepspeed_config()
    path = os.path.join(out_dir, "pretrained")
    if accelerator.is_main_process:
        make_model("llama", seed=5).save_pretrained(path)
    accelerator.wait_for_everyone()
    plain = AutoModelForCausalLM.from_pretrained(path).state_dict()
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    keep = HfDeepSpeedConfig(config)  # must stay alive while from_pretrained runs
    model = AutoModelForCausalLM.from_pretrained(path)
    params = list(model.parameters())
    partitioned = all(hasattr(p, "ds_id") and p.numel() == 0 for p in params)
    with deepspeed.zero.GatheredParameters(params):
        loaded = {k: v.detach().clone() for k, v in model.state_dict().items()}
    del keep
    diffs = {k: float((loaded[k].float() - v.float()).abs().max()) for k, v in plain.items()}
    return {
        "partitioned": partitioned,
        "keys_equal": sorted(loaded) == sorted(plain),
        "max_diff": max(diffs.values()),
        "dtype": str(params[0].dtype),
    }


def main():
    out_dir, stage = sys.argv[1], int(sys.argv[2])
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

    initial = {k: v.clone() for k, v in make_model("gpt2").state_dict().items()}
    plugin = DeepSpeedPlugin(hf_ds_config=ds_config(stage, out_dir))
    # Gloo named explicitly: with no accelerator Accelerate picks no backend for DeepSpeed
    # and counts one process (accelerate/state.py); the real DeepSpeed meets the same.
    accelerator = Accelerator(
        deepspeed_plugin=plugin, kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")]
    )
    facts = train(accelerator, stage, initial, out_dir)
    facts["reference"], facts["reference_grad_norms"] = reference(
        initial, accelerator.num_processes
    )
    if stage == 3:
        facts["from_pretrained"] = zero3_from_pretrained(out_dir, accelerator)
    if accelerator.is_main_process:
        print("RESULT " + json.dumps(facts))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()

"""Trainer with DeepSpeed on 2 CPU processes (run by test_trainer.py under
torch.distributed.run). Accelerate gives DeepSpeed no backend when there is no accelerator
and then counts one process (accelerate/state.py), so the script configures the process
state itself: PartialState(backend="gloo") with ACCELERATE_USE_DEEPSPEED=true, and
TrainingArguments(accelerator_config={"use_configured_state": True}). The same holds with
the real DeepSpeed on CPU.

argv: out_dir. Rank 0 prints the logged losses and what the engine saw."""

import json
import os
import sys

from hf_models import BATCH, TokenData, ds_config
from trainer_worker import arguments, fresh_model, initial_weights, losses_of


def main():
    out_dir = sys.argv[1]
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    from accelerate import PartialState
    from transformers import Trainer

    state = PartialState(backend="gloo")
    cfg = ds_config(3, "cpu", "cpu", os.path.join(out_dir, "nvme"))
    args = arguments(
        out_dir,
        deepspeed=cfg,
        gradient_accumulation_steps=1,  # 2 processes x 4: the single-process run's 4 x 2
        accelerator_config={"use_configured_state": True},
    )
    initial = initial_weights("gpt2")
    trainer = Trainer(
        model=fresh_model("gpt2", initial), args=args, train_dataset=TokenData(3 * 2 * BATCH)
    )
    trainer.train()
    engine = trainer.model_wrapped
    facts = {
        "losses": losses_of(trainer),
        "world": args.world_size,
        "num_processes": state.num_processes,
        "dp_world_size": engine.dp_world_size,
        "stage": engine.zero_optimization_stage(),
        "train_batch_size": engine.train_batch_size(),
    }
    engine.destroy()
    if state.is_main_process:
        print("RESULT " + json.dumps(facts))


if __name__ == "__main__":
    main()

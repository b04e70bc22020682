"""A training script that resumes by itself (the one-line pattern of README "Several
machines": load the newest checkpoint when one exists), for test_run_restarts.py.

    zerostream run --nproc 2 --max_restarts 2 --no_local_rank restart_train.py OUT KILL

KILL "none" trains uninterrupted. KILL "both": on the first attempt rank 1 SIGKILLs itself
between backward and step of step 2 (in the middle of a step); on the second, inside the save
after step 4 (in the middle of writing its optimizer state). Rank 0 appends {"step", "loss",
"attempt"} per step to OUT/losses.jsonl, after backward (a step that dies is recorded too).
"""

import json
import os
import pathlib
import signal
import sys

import torch

import zerostream

STEPS, KILL_IN_STEP, KILL_IN_SAVE = 6, 2, 4

out, kill = pathlib.Path(sys.argv[1]), sys.argv[2]
rank = int(os.environ["RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
config = {
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
}
engine, *_ = zerostream.initialize(model=model, config=config)
ckpt = out / "ckpt"
start = 0
if (ckpt / "latest").exists():  # the pattern: resume from the newest complete checkpoint
    _, client = engine.load_checkpoint(str(ckpt))
    start = client["step"]

for step in range(start, STEPS):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(4, 8, generator=g)
    loss = (engine(x) - x.sum(dim=1, keepdim=True).sin()).square().mean()
    engine.backward(loss)
    if rank == 0:  # before step(): a step that dies is recorded, and again when redone
        with open(out / "losses.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "loss": loss.item(), "attempt": attempt}) + "\n")
    if kill == "both" and attempt == 0 and step == KILL_IN_STEP and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    engine.step()
    if kill == "both" and attempt == 1 and step == KILL_IN_SAVE:
        os.environ["ZEROSTREAM_TEST_KILL_AT"] = "during_optim_states@1"
    engine.save_checkpoint(str(ckpt), client_state={"step": step + 1})
    os.environ.pop("ZEROSTREAM_TEST_KILL_AT", None)
engine.destroy()

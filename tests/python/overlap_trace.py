"""The update behind the next forward (zero/overlap.py), watched: a log of its pieces and of
the forward's gathers, a hold on one piece until the forward has gathered, the check that
each gather came after the pieces that write its shards; and the training loop its tests
compare with the serial step."""

import threading

import torch


def watch(opt, hold_at):
    """From now on logs opt's update pieces ("piece", g, lo, hi) and the forward's gathers
    ("gather", [(g, at, n), ...]) in order, and holds the update before piece `hold_at` until
    a gather ran (60 s at most). Returns (log, held): held["waited"] is True when it did."""
    behind, part = opt.behind, opt.part
    log = behind.log = []
    gate = part.before_shard_access
    gathered = threading.Event()
    held = {"waited": None}

    def logged_gate(zps):
        gate(zps)
        ids = [zp.ds_id for zp in zps]
        slots = [opt.slots[i] + (part.params[i].shard_numel,) for i in ids if i in opt.slots]
        log.append(("gather", slots))
        gathered.set()

    def hold(piece):
        if piece == hold_at:
            held["waited"] = gathered.wait(timeout=60)

    part.before_shard_access = logged_gate
    behind.piece_hook = hold
    return log, held


def pieces_of(log):
    return [tuple(entry[1:]) for entry in log if entry[0] == "piece"]


def gathers_beside(log, plan, rank) -> int:
    """Asserts that every gather in `log` came after the pieces of `plan` that write its
    shards; returns how many gathers ran before the whole plan was done."""
    plan = [tuple(p) for p in plan]
    done, beside = set(), 0
    for entry in log:
        if entry[0] == "piece":
            done.add(tuple(entry[1:]))
            continue
        for group, at, n in entry[1]:
            missing = [
                p for p in plan if p[0] == group and p[1] < at + n and p[2] > at and p not in done
            ]
            assert not missing, f"rank {rank}: a gather read [{at}, {at + n}) before {missing}"
        beside += len(done) < len(plan)
    return beside


def train_steps(engine, xs, ys, rank, world, gas):
    """steps x gas micro-steps of the global batches xs[s], ys[s] (this rank's slice of each
    micro-batch); returns each step's loss summed over ranks and micro-steps, its pre-clip
    global norm and its lr."""
    import torch.distributed as dist

    micro = xs[0].shape[0] // (world * gas)
    losses, norms, lrs = [], [], []
    for s in range(len(xs)):
        total = torch.zeros(())
        for m in range(gas):
            lo = (m * world + rank) * micro
            loss = engine(xs[s][lo : lo + micro], ys[s][lo : lo + micro])
            engine.backward(loss)
            engine.step()
            total += loss.detach().float()
        dist.all_reduce(total)
        losses.append(float(total))
        norms.append(float(engine.get_global_grad_norm()))
        lrs.append(engine.get_lr()[0])
    return losses, norms, lrs


def step_config(micro: int, gas: int, dtype: str, zero: dict, clip: float = 0.05) -> dict:
    """The overlapped-step tests' ds_config around `zero`: AdamW under a WarmupLR that moves
    the lr every step, gradient clipping at `clip` (0.05 is below the tiny model's norms:
    the clip triggers), and with fp16 a loss scale that overflows at first."""
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": clip,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2, "warmup_num_steps": 10},
        },
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == "bf16"},
        "fp16": {"enabled": dtype == "fp16", "initial_scale_power": 16, "hysteresis": 1},
    }


def third_loss(engine, xs, ys, rank, world) -> float:
    """Two steps on this rank's slice of xs[0:2], then the third batch's loss (the forward
    that runs beside the second step's update when it is overlapped); destroys the engine."""
    n = xs[0].shape[0] // world
    micro = slice(rank * n, (rank + 1) * n)
    for s in range(2):
        engine.backward(engine(xs[s][micro], ys[s][micro]))
        engine.step()
    loss = float(engine(xs[2][micro], ys[2][micro]))
    engine.destroy()
    return loss

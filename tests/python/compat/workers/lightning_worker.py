"""PyTorch Lightning's DeepSpeedStrategy on zerostream, 2 Gloo ranks under torchrun.

    python -m torch.distributed.run --nproc_per_node=2 lightning_worker.py OUT_DIR

Trains one tiny model four ways with the same seed and data: `strategy="ddp"` (the
reference), DeepSpeed stage 2 with the optimizer offloaded, stage 3 with the parameters and
optimizer offloaded and the model built in `configure_model` (under zero.Init), and stage 3
again resumed from a checkpoint saved after the first epoch. Rank 0 prints
`RESULT {json}`: each run's per-step losses and final weights, what the stage-3 model's
parameters looked like inside training, and the checkpoint converted by Lightning's
`convert_zero_checkpoint_to_fp32_state_dict`.

Lightning refuses DeepSpeed on a CPU accelerator by itself (DeepSpeedStrategy's
setup_environment); `CPUDeepSpeedStrategy` lifts that check, the recipe docs/compat.md gives
for CPU runs.
"""

import json
import logging
import os
import sys
import warnings

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.seed import reset_seed
from pytorch_lightning.strategies import DDPStrategy, DeepSpeedStrategy
from pytorch_lightning.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore")
logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

OUT = sys.argv[1]
STEPS_PER_EPOCH = 4
MICRO = 2
DIM = 8


class CPUDeepSpeedStrategy(DeepSpeedStrategy):
    """DeepSpeedStrategy on a CPU accelerator: Lightning checks for CUDA itself, in these
    two methods (a CUDA accelerator; device indices equal to the local ranks)."""

    def setup_environment(self) -> None:
        DDPStrategy.setup_environment(self)

    def setup_distributed(self) -> None:
        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()


class Tiny(pl.LightningModule):
    def __init__(self, build_in_configure_model: bool = False, cpu_adam: bool = False):
        super().__init__()
        self.cpu_adam = cpu_adam
        self.losses = []
        self.seen_partitioned = None
        self.net = None
        if not build_in_configure_model:
            self.net = self._build()

    @staticmethod
    def _build():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(DIM, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )

    def configure_model(self):
        if self.net is None:
            self.net = self._build()

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.seen_partitioned is None:
            # Inside training at stage 3 the weights are partitioned (ds_numel, empty data).
            # Read past zerostream's watch (`_parameters.get`): reading the attribute inside a
            # forward gathers the weight, as an external parameter.
            p = self.net[0]._parameters.get("weight")
            self.seen_partitioned = bool(getattr(p, "ds_numel", 0)) and p.numel() == 0
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        # With an offloaded optimizer DeepSpeed (and so zerostream) wants its CPU Adam, which
        # Lightning's docs use there; in AdamW mode it is torch's AdamW.
        if self.cpu_adam:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(self.parameters(), lr=5e-2, weight_decay=0.01)
        return torch.optim.AdamW(self.parameters(), lr=5e-2, weight_decay=0.01)


def data():
    g = torch.Generator().manual_seed(1)
    n = STEPS_PER_EPOCH * MICRO * 2  # two ranks
    x = torch.randn(n, DIM, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    return DataLoader(TensorDataset(x, y), batch_size=MICRO, shuffle=False)


def trainer(strategy, epochs):
    return pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=True,
        default_root_dir=OUT,
    )


def full_weights(module, stage3):
    """{"net.0.weight": [...], ...}: the whole weights (gathered at stage 3)."""
    named = list(module.named_parameters())
    if stage3:
        import deepspeed

        with deepspeed.zero.GatheredParameters([p for _, p in named]):
            return {n: p.detach().flatten().tolist() for n, p in named}
    return {n: p.detach().flatten().tolist() for n, p in named}


def deepspeed_strategy(stage, **kw):
    strategy = CPUDeepSpeedStrategy(stage=stage, process_group_backend="gloo", **kw)
    if stage == 3:
        # These weights are far below the persistence threshold, which would keep them whole;
        # 0 partitions every one (Lightning's default config otherwise, aio section included).
        strategy.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    return strategy


def main():
    result = {}

    ddp = Tiny()
    trainer(DDPStrategy(process_group_backend="gloo"), 2).fit(ddp, data())
    result["ddp"] = {"losses": ddp.losses, "weights": full_weights(ddp, False)}

    s2 = Tiny(cpu_adam=True)
    t2 = trainer(deepspeed_strategy(2, offload_optimizer=True), 2)
    t2.fit(s2, data())
    result["stage2"] = {
        "losses": s2.losses,
        "weights": full_weights(s2, False),
        "engine": type(t2.strategy.deepspeed_engine).__name__,
    }

    s3 = Tiny(build_in_configure_model=True, cpu_adam=True)
    t3 = trainer(deepspeed_strategy(3, offload_optimizer=True, offload_parameters=True), 1)
    t3.fit(s3, data())
    ckpt = os.path.join(OUT, "stage3.ckpt")
    t3.save_checkpoint(ckpt)
    result["stage3_epoch1"] = {
        "losses": s3.losses,
        "partitioned": s3.seen_partitioned,
        "weights": full_weights(s3, True),
    }

    # A fresh model and trainer resume the checkpoint for the second epoch.
    r3 = Tiny(build_in_configure_model=True, cpu_adam=True)
    tr = trainer(deepspeed_strategy(3, offload_optimizer=True, offload_parameters=True), 2)
    tr.fit(r3, data(), ckpt_path=ckpt)
    result["stage3_resumed"] = {"losses": r3.losses, "weights": full_weights(r3, True)}

    if int(os.environ["RANK"]) == 0:
        out = os.path.join(OUT, "converted.pt")
        state = convert_zero_checkpoint_to_fp32_state_dict(ckpt, out)
        result["converted"] = {
            "epoch": state.get("epoch"),
            "global_step": state.get("global_step"),
            "weights": {k: v.flatten().tolist() for k, v in state["state_dict"].items()},
        }
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

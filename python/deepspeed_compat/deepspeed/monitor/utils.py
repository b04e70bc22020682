"""`deepspeed.monitor.utils`: the package checks, raising ImportError when the package a
writer needs is missing (zerostream's writers call them only for enabled sections)."""

from zerostream.monitor.base import require_package


def check_tb_availability() -> None:
    require_package("tensorboard", "tensorboard", "tensorboard.enabled", "TensorBoard files")


def check_wandb_availability() -> None:
    require_package("wandb", "wandb", "wandb.enabled", "Weights & Biases runs")


def check_comet_availability() -> None:
    require_package("comet_ml", "comet_ml", "comet.enabled", "Comet experiments")


__all__ = ["check_comet_availability", "check_tb_availability", "check_wandb_availability"]

"""`deepspeed.pipe` (PipelineModule, LayerSpec, TiedLayerSpec): importable, refused when built,
naming the feature. Importing them is harmless (DeepSpeed's test models subclass
PipelineModule at import time); building one is where pipeline parallelism would start."""

import torch

from .._unsupported import PIPELINE_PARALLELISM, RefusedOnUse

_HINT = "train the model whole with ZeRO data parallelism (stage 3 partitions its parameters)"


class PipelineModule(RefusedOnUse, torch.nn.Module):
    _feature, _what, _hint = PIPELINE_PARALLELISM, "deepspeed.pipe.PipelineModule", _HINT


class LayerSpec(RefusedOnUse):
    _feature, _what, _hint = PIPELINE_PARALLELISM, "deepspeed.pipe.LayerSpec", _HINT


class TiedLayerSpec(LayerSpec):
    _what = "deepspeed.pipe.TiedLayerSpec"


__all__ = ["LayerSpec", "PipelineModule", "TiedLayerSpec"]

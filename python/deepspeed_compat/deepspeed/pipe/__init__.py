"""`deepspeed.pipe` (PipelineModule, LayerSpec): refused on import, naming the feature."""

from .._unsupported import PIPELINE_PARALLELISM, unsupported

raise unsupported(
    PIPELINE_PARALLELISM,
    "deepspeed.pipe",
    "train the model whole with ZeRO data parallelism (stage 3 partitions its parameters)",
)

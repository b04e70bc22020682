"""`deepspeed.elasticity.config`: the section's reader and its errors."""

from zerostream.config.elasticity import (
    ElasticityConfig,
    ElasticityConfigError,
    ElasticityError,
    ElasticityIncompatibleWorldSize,
)

__all__ = [
    "ElasticityConfig",
    "ElasticityConfigError",
    "ElasticityError",
    "ElasticityIncompatibleWorldSize",
]

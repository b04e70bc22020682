"""`deepspeed.elasticity`: elastic batch sizes (zerostream/elasticity.py)."""

from zerostream.config.elasticity import (
    compute_elastic_config,
    elasticity_enabled,
    ensure_immutable_elastic_config,
)

from . import config, constants  # noqa: F401
from .constants import ELASTICITY, ENABLED, ENABLED_DEFAULT

__all__ = [
    "ELASTICITY",
    "ENABLED",
    "ENABLED_DEFAULT",
    "compute_elastic_config",
    "elasticity_enabled",
    "ensure_immutable_elastic_config",
]

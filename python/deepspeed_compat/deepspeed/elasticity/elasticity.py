"""`deepspeed.elasticity.elasticity`: the batch-size search (zerostream/elasticity.py)."""

from zerostream.config.elasticity import (
    HCN_LIST,
    compute_elastic_config,
    elasticity_enabled,
    ensure_immutable_elastic_config,
    get_best_candidates,
    get_candidate_batch_sizes,
    get_valid_gpus,
)

__all__ = [
    "HCN_LIST",
    "compute_elastic_config",
    "elasticity_enabled",
    "ensure_immutable_elastic_config",
    "get_best_candidates",
    "get_candidate_batch_sizes",
    "get_valid_gpus",
]

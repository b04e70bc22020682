"""`deepspeed.elasticity.constants`: the section's key names and defaults."""

from zerostream.config.elasticity import DEFAULTS as _D
from zerostream.config.elasticity import LATEST_VERSION, SCHEDULER_CONFIG_ENV

ELASTICITY = "elasticity"
LATEST_ELASTICITY_VERSION = LATEST_VERSION
ENABLED, ENABLED_DEFAULT = "enabled", _D["enabled"]
MAX_ACCEPTABLE_BATCH_SIZE = "max_train_batch_size"
MAX_ACCEPTABLE_BATCH_SIZE_DEFAULT = _D[MAX_ACCEPTABLE_BATCH_SIZE]
MICRO_BATCHES, MICRO_BATCHES_DEFAULT = "micro_batch_sizes", _D["micro_batch_sizes"]
MIN_GPUS, MIN_GPUS_DEFAULT = "min_gpus", _D["min_gpus"]
MAX_GPUS, MAX_GPUS_DEFAULT = "max_gpus", _D["max_gpus"]
NUM_GPUS_PER_NODE, NUM_GPUS_PER_NODE_DEFAULT = "num_gpus_per_node", _D["num_gpus_per_node"]
MODEL_PARALLEL_SIZE = "model_parallel_size"
MODEL_PARALLEL_SIZE_DEFAULT = _D[MODEL_PARALLEL_SIZE]
MIN_TIME, MIN_TIME_DEFAULT = "min_time", _D["min_time"]
PREFER_LARGER_BATCH, PREFER_LARGER_BATCH_DEFAULT = "prefer_larger_batch", _D["prefer_larger_batch"]
IGNORE_NON_ELASTIC_BATCH_INFO = "ignore_non_elastic_batch_info"
IGNORE_NON_ELASTIC_BATCH_INFO_DEFAULT = _D[IGNORE_NON_ELASTIC_BATCH_INFO]
VERSION, VERSION_DEFAULT = "version", _D["version"]
DEEPSPEED_ELASTICITY_CONFIG = SCHEDULER_CONFIG_ENV

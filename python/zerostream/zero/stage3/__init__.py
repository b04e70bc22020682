"""ZeRO stage 3: partitioned parameters (param.py), their gathers and releases
(partitioner.py), the trace-driven coordinator (coordinator.py) and module hooks (hooks.py),
gradient reduce-scatter (reduce.py), the optimizer (optimizer.py), zero.Init (init.py) and
GatheredParameters (gathered.py)."""

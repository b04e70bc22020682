"""`deepspeed.runtime.zenflow.zenflow_utils`: the core split of pt_reserved_cores_perc."""

from zerostream.zero.zenflow.affinity import split_affinity as _split_affinity

__all__ = ["_split_affinity"]

"""`deepspeed.runtime.comm`: DeepSpeed's coalesced collectives (coalesced_collectives.py)."""

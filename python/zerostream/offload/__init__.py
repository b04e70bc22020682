"""Python side of the offload tiers (host arena, swap I/O)."""

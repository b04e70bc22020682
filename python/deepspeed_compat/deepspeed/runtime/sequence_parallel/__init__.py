"""`deepspeed.runtime.sequence_parallel`: DeepSpeed's Ulysses / ALST sequence parallelism,
which zerostream does not implement (importing ulysses_sp says so)."""

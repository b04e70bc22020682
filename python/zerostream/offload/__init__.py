"""Python side of the offload tiers. Host memory: host_buffers (aligned buffers, page-locked
arenas, GPU registration), memory_preflight (what the process may still allocate). Files:
io_engine (asynchronous reads and writes), swap_store (a rank's swap files), crc32c,
fault_injection (test only). Above them: copy_stage, optimizer_swap, sinks, and placement/
(which tier holds what under "auto"). Nothing here imports zero/: stage 3's parameter
swapper, which knows its ZeroParams, lives in zero/stage3/param_swap.py."""

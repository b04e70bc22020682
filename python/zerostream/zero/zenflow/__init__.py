"""ZenFlow (DeepSpeed's stall-free offload) at ZeRO stages 1 and 2: optimizer.py's docstring
tells the design; support.py what runs with it."""

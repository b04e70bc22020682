"""DeepSpeed-compatible ops: CPU optimizers (adam, adagrad, lion) and the async I/O handle (aio)."""

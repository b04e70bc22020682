"""DeepSpeed-compatible ops: CPU optimizers (adam, adagrad, lion) and the async I/O handle (aio).

`zerostream.ops.adam.DeepSpeedCPUAdam` is what `deepspeed.ops.adam.DeepSpeedCPUAdam` is.
"""

from . import adagrad, adam, aio, lion

__all__ = ["adam", "adagrad", "lion", "aio"]

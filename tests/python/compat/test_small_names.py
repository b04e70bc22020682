"""DeepSpeed names whose absence failed DeepSpeed's unit tests at import or construction:
`deepspeed.utils.RepeatingLoader` (also runtime.dataloader), offload_config's section
classes constructible with the schema's defaults, and the attributes `deepspeed.elasticity`,
`deepspeed.monitor`, `deepspeed.comm.configure` / `log_summary` / `reset_log`."""

from compat_run import run_python

WORKER = r"""
import deepspeed
from deepspeed.runtime.dataloader import RepeatingLoader as R2
from deepspeed.runtime.zero.offload_config import (
    DeepSpeedZeroOffloadOptimizerConfig as Opt, DeepSpeedZeroOffloadParamConfig as Par,
)
from deepspeed.utils import RepeatingLoader
from deepspeed.utils.comms_logging import CommsLogger
from deepspeed.utils.timer import trim_mean
import zerostream.comm, zerostream.data

assert RepeatingLoader is R2 is zerostream.data.RepeatingLoader
opt = Opt()
assert isinstance(opt, Opt)
assert (opt.device, opt.pipeline, opt.buffer_count) == ("none", False, 4)
assert Opt(pipeline_read=True).pipeline and Par(device="cpu").device == "cpu"
assert deepspeed.elasticity.compute_elastic_config is not None and deepspeed.monitor.monitor
assert deepspeed.comm.comms_logger is zerostream.comm.comms_logger
assert (deepspeed.comm.configure, deepspeed.comm.reset_log) == (
    zerostream.comm.configure, zerostream.comm.reset_log)
assert isinstance(deepspeed.comm.comms_logger, CommsLogger) and trim_mean([1, 2, 3], 0.1) == 2
print("ok")
"""


def test_small_names(compat_env):
    done = run_python(["-c", WORKER], compat_env, timeout=300)
    assert done.stdout.strip().splitlines()[-1] == "ok"

"""DeepSpeed names whose absence failed DeepSpeed's unit tests at import or construction:
`deepspeed.utils.RepeatingLoader` (also runtime.dataloader), offload_config's section
classes constructible with the schema's defaults, and the attributes `deepspeed.elasticity`,
`deepspeed.monitor`, `deepspeed.comm.configure` / `log_summary` / `reset_log`, and
`runtime.precision_config.DeepSpeedFP16Config` (pydantic's ValidationError for a bad section,
as DeepSpeed's model raises, with the schema's message naming the key); the offload section's
`ratio` alone, and a launcher runner's quoted exports."""

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
from deepspeed.runtime.precision_config import DeepSpeedFP16Config as FP16
from pydantic import ValidationError
fp16 = FP16(enabled=True, loss_scale=0, loss_scale_window=5)
assert isinstance(fp16, FP16) and (fp16.loss_scale, fp16.loss_scale_window) == (0, 5)
assert fp16.dynamic_loss_scale and FP16(loss_scale=128, min_loss_scale=-1).min_loss_scale == -1
assert FP16(enabled=False, loss_scale_window=0).loss_scale_window == 0  # unused: accepted
for bad, key in ((dict(loss_scale=-1), "fp16.loss_scale"), (dict(loss_scale=float("inf")),
                 "fp16.loss_scale"), (dict(enabled=True, min_loss_scale=0), "fp16.min_loss_scale")):
    try:
        FP16(**bad)
        raise SystemExit(f"accepted {bad}")
    except ValidationError as exc:
        assert key in str(exc), str(exc)
# ZeRO-Offload++'s ratio checked with the section alone, as DeepSpeed's class does
assert Opt(ratio=0.3).ratio == 0.3
# A runner's export shows DeepSpeed's quoting of a value the shell reads specially (SLURM's
# `64(x2)`); the command carries the value itself, quoted once.
from deepspeed.launcher.multinode_runner import PDSHRunner
from deepspeed.launcher.runner import parse_args
args = parse_args(["--launcher", "pdsh", "train.py", "--x", "1"])
runner = PDSHRunner(args, "e30=")
runner.add_export("SLURM_JOB_CPUS_PER_NODE", "64(x2)")
runner.add_export("PYTHONPATH", "/usr/lib/python3/site-packages")
assert runner.exports == {"SLURM_JOB_CPUS_PER_NODE": '"64(x2)"',
                          "PYTHONPATH": "/usr/lib/python3/site-packages"}
line = " ".join(runner.get_cmd({}, {"localhost": [0]})[0])  # PDSH's: (start, kill, env)
assert "SLURM_JOB_CPUS_PER_NODE='64(x2)'" in line and '"64(x2)"' not in line, line
print("ok")
"""


def test_small_names(compat_env):
    done = run_python(["-c", WORKER], compat_env, timeout=300)
    assert done.stdout.strip().splitlines()[-1] == "ok"

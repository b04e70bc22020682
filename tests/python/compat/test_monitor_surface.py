"""`deepspeed.monitor` in the installed compatibility package: DeepSpeed's module and class
names for zerostream's writers, and its config classes, whose defaults are the schema's and
whose unknown keys and bad values are refused naming the key."""

from compat_run import run_python

WORKER = r"""
import pytest
from deepspeed.monitor.comet import CometMonitor
from deepspeed.monitor.config import (
    CometConfig, DeepSpeedMonitorConfig, TensorBoardConfig, get_monitor_config,
)
from deepspeed.monitor.csv_monitor import csvMonitor
from deepspeed.monitor.monitor import Monitor, MonitorMaster
from deepspeed.monitor.tensorboard import TensorBoardMonitor
from deepspeed.monitor.wandb import WandbMonitor
from deepspeed.runtime.config import DeepSpeedConfig
import zerostream.monitor as zm

assert (csvMonitor, TensorBoardMonitor, WandbMonitor, CometMonitor, MonitorMaster) == (
    zm.CsvMonitor, zm.TensorBoardMonitor, zm.WandbMonitor, zm.CometMonitor, zm.MonitorMaster)
assert issubclass(MonitorMaster, Monitor)
defaults = DeepSpeedMonitorConfig()
assert isinstance(defaults, DeepSpeedMonitorConfig) and not defaults.enabled
assert (defaults.tensorboard.output_path, defaults.tensorboard.job_name) == ("", "DeepSpeedJobName")
assert (defaults.csv_monitor.output_path, defaults.csv_monitor.job_name) == ("", "DeepSpeedJobName")
w = defaults.wandb
assert (w.project, w.group, w.team) == ("deepspeed", None, None)
assert (defaults.comet.enabled, defaults.comet.samples_log_interval) == (False, 100)
tb = TensorBoardConfig(enabled=True, job_name="x")
assert isinstance(tb, TensorBoardConfig) and (tb.enabled, tb.job_name) == (True, "x")
assert CometConfig(samples_log_interval=7).samples_log_interval == 7
assert get_monitor_config({"csv_monitor": {"enabled": True}}).enabled
ds = DeepSpeedConfig({"train_batch_size": 1, "wandb": {"team": "t"}})
assert ds.monitor_config.wandb.team == "t" and not ds.monitor_config.enabled
with pytest.raises(ValueError, match="tensorboard.enabeld"):
    DeepSpeedMonitorConfig(tensorboard={"enabeld": True})
with pytest.raises(ValueError, match="comet.samples_log_interval"):
    CometConfig(samples_log_interval="often")
print("ok")
"""


def test_monitor_names_and_config_classes(compat_env):
    done = run_python(["-c", WORKER], compat_env, timeout=300)
    assert done.stdout.strip().splitlines()[-1] == "ok"

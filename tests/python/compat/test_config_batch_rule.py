"""`deepspeed.runtime.config.DeepSpeedConfig(...)`: zerostream's resolved config, frozen but
for the three batch fields, which DeepSpeed's callers may assign and resolve again with
`_configure_train_batch_size()`: DeepSpeed's batch rule, an AssertionError when the fields
cannot agree (its `unit/runtime/test_ds_config_dict.py::TestBatchConfig` does this)."""

import json

from compat_run import run_python

WORKER = r"""
import dataclasses, json
from deepspeed.runtime.config import DeepSpeedConfig
import zerostream.config

cfg = DeepSpeedConfig({"train_batch_size": 8, "optimizer": {"type": "Adam"}})
out = {"is_zerostreams": isinstance(cfg, zerostream.config.DeepSpeedConfig)}

def run(train, micro, gas, world):
    object.__setattr__(cfg, "_world", world)
    cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu = train, micro
    cfg.gradient_accumulation_steps = gas
    try:
        cfg._configure_train_batch_size()
    except AssertionError:
        return None
    return [cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu,
            cfg.gradient_accumulation_steps]

cases = [(32, 16, 1, 2), (32, 8, 2, 2), (33, 17, 2, 2), (32, 18, 1, 2), (32, 16, None, 2),
         (32, None, 2, 2), (None, 8, 2, 2), (32, None, None, 2), (None, 16, None, 2),
         (None, None, 2, 2), (32, 17, None, 2)]
out["cases"] = [run(*c) for c in cases]
try:
    cfg.gradient_clipping = 2.0
    out["frozen"] = False
except dataclasses.FrozenInstanceError:
    out["frozen"] = True
print(json.dumps(out))
"""


def test_the_batch_fields_resolve_by_deepspeeds_rule(compat_env):
    done = run_python(["-c", WORKER], compat_env, timeout=120)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["is_zerostreams"] and out["frozen"]
    assert out["cases"] == [
        [32, 16, 1],  # all three agree
        [32, 8, 2],
        None,  # 33 != 17 * 2 * 2
        None,  # 32 != 18 * 1 * 2
        [32, 16, 1],  # accumulation derived
        [32, 8, 2],  # micro-batch derived
        [32, 8, 2],  # train batch derived
        [32, 16, 1],  # train batch alone: accumulation 1
        [32, 16, 1],  # micro-batch alone
        None,  # accumulation alone
        None,  # 32 // 17 // 2 = 0: no micro-batch fits
    ]

"""`deepspeed.runtime.constants` (the compatibility package's copy of DeepSpeed's key names and
defaults) pinned against the defaults zerostream itself resolves: every `<NAME>_DEFAULT`
constant is compared with what `zerostream.config.load` gives for a config that does not set
`<NAME>`'s key, so the two cannot drift apart (a script that reads the constant trains with
the value it names). The module is read from its file: it imports nothing."""

import importlib.util
import pathlib

import pytest

from zerostream import config

CONSTANTS = (
    pathlib.Path(__file__).resolve().parents[3]
    / "python/deepspeed_compat/deepspeed/runtime/constants.py"
)

# Defaults DeepSpeed states as "unset" that the config resolves to a value, each with why.
RESOLVED = {
    # the batch rule fills the three in from the one given (train_batch_size =
    # micro x accumulation x data-parallel ranks)
    "TRAIN_BATCH_SIZE_DEFAULT": "train_batch_size",
    "GRADIENT_ACCUMULATION_STEPS_DEFAULT": "gradient_accumulation_steps",
    # unset means "the parameters' dtype": fp32 for an fp32 run
    "COMMUNICATION_DATA_TYPE_DEFAULT": "communication_data_type",
}
# Set in every config below (the batch rule needs one batch key).
GIVEN = {"TRAIN_MICRO_BATCH_SIZE_PER_GPU_DEFAULT"}


def _constants():
    spec = importlib.util.spec_from_file_location("ds_constants", CONSTANTS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _resolved(cfg, module, name):
    """What zerostream resolved for the key `name` (a `<BASE>_DEFAULT`) names."""
    base = name[: -len("_DEFAULT")]
    if base in ("OPTIMIZER_TYPE", "SCHEDULER_TYPE"):  # the section's "type"
        section = getattr(cfg, base.split("_")[0].lower())
        return None if section is None else section.type
    section = cfg
    if base.startswith("FP16_"):
        section = cfg.fp16
    elif base.startswith("BFLOAT16_"):
        section = cfg.bf16
    return getattr(section, getattr(module, base))


def test_every_default_the_compatibility_package_names_is_the_one_zerostream_applies():
    module = _constants()
    cfg = config.load({"train_micro_batch_size_per_gpu": 1}, world_size=1, log=False)
    names = sorted(n for n in dir(module) if n.endswith("_DEFAULT"))
    assert len(names) >= 30
    checked = 0
    for name in names:
        if name in RESOLVED or name in GIVEN:
            continue
        stated, applied = getattr(module, name), _resolved(cfg, module, name)
        assert stated == applied, (
            f"{name}: the package says {stated!r}, zerostream applies {applied!r}"
        )
        checked += 1
    assert checked == len(names) - len(RESOLVED) - len(GIVEN)


@pytest.mark.parametrize("name", sorted(RESOLVED))
def test_defaults_deepspeed_leaves_unset_are_resolved_as_deepspeed_does(name):
    module = _constants()
    assert getattr(module, name) is None
    cfg = config.load({"train_micro_batch_size_per_gpu": 2}, world_size=3, log=False)
    value = getattr(cfg, RESOLVED[name])
    expected = {"train_batch_size": 6, "gradient_accumulation_steps": 1}
    assert value == expected.get(RESOLVED[name], "fp32"), (name, value)

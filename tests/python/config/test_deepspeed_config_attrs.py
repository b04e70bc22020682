"""Attributes DeepSpeed's DeepSpeedConfig has that its callers read (DeepSpeed's own
test_ds_config_dict.py reads both): `_param_dict`, the input dict, and `eigenvalue_*`, read
from quantize_training.eigenvalue and only while quantize_training is enabled (DeepSpeed's
get_eigenvalue_config), else DeepSpeed's defaults."""

import pytest

from zerostream import config

DEFAULTS = {
    "enabled": False,
    "verbose": False,
    "max_iter": 100,
    "tol": 1e-2,
    "stability": 1e-6,
    "gas_boundary_resolution": 1,
    "layer_name": "bert.encoder.layer",
    "layer_num": 0,
}


def _load(extra: dict):
    return config.load({"train_micro_batch_size_per_gpu": 1, **extra}, world_size=1, log=False)


def test_param_dict_is_the_input():
    given = {"compression_training": {"weight_quantization": {"shared_parameters": {}}}}
    cfg = _load(given)
    assert cfg._param_dict["compression_training"] == given["compression_training"]
    assert cfg._param_dict["train_micro_batch_size_per_gpu"] == 1


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"eigenvalue": {"verbose": True, "max_iter": 5}},  # a root section: not where it is read
        {"quantize_training": {"enabled": False, "eigenvalue": {"verbose": True}}},
    ],
)
def test_eigenvalue_settings_default_unless_quantize_training_is_enabled(extra):
    cfg = _load(extra)
    for key, value in DEFAULTS.items():
        assert getattr(cfg, f"eigenvalue_{key}") == value, key


def test_eigenvalue_settings_come_from_quantize_training():
    cfg = _load(
        {"quantize_training": {"enabled": True, "eigenvalue": {"verbose": True, "tol": 0.5}}}
    )
    assert cfg.eigenvalue_verbose is True and cfg.eigenvalue_tol == 0.5
    assert cfg.eigenvalue_max_iter == 100  # not given: DeepSpeed's default
    with pytest.raises(AttributeError, match="eigenvalue_bogus"):
        _ = cfg.eigenvalue_bogus

"""Hostile and unlucky config input (reliability issue, items 4, 6, 7, 8, 18): each fails fast
with an error naming the key, or is read as the user meant, never a crash or a wrong value."""

import json
import subprocess
import sys
import time

import pytest

from zerostream import _C, config


def _errors(cfg) -> str:
    with pytest.raises(ValueError) as info:
        config.load(cfg, world_size=1, log=False)
    return str(info.value)


def test_deep_nesting_is_an_error_with_the_depth_and_position_not_a_stack_overflow(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"a": ' + "[" * 43_500 + "]" * 43_500 + "}")
    msg = _errors(str(deep))
    assert "nested deeper than 64 levels" in msg and "(line 1, column 70)" in msg
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        _C.read_json_text("[" * 43_500 + "]" * 43_500, "x")
    ok = '{"a": ' + "[" * 60 + "]" * 60 + "}"  # deep but sane
    assert _C.read_json_text(ok, "x")["a"] is not None


def test_an_object_of_80000_keys_reads_in_linear_time(tmp_path):
    text = "{" + ",".join(f'"k{i}": {i}' for i in range(80_000)) + "}"
    start = time.perf_counter()
    obj = _C.read_json_text(text, "big.json")
    took = time.perf_counter() - start
    assert len(obj) == 80_000 and obj["k79999"] == 79_999
    assert list(obj)[:3] == ["k0", "k1", "k2"]  # file order kept
    # Quadratic insertion took 8 s here; linear takes ~0.05 s. A wide margin for slow CI.
    assert took < 3.0, took
    with pytest.raises(ValueError, match='duplicate key "k5"'):
        _C.read_json_text('{"k5": 1, "k6": 2, "k5": 3}', "dup.json")


def test_unknown_keys_are_listed_up_to_twenty_then_counted():
    zero = {"stage": 2, **{f"bogus_{i}": 1 for i in range(30)}}
    msg = _errors({"train_batch_size": 2, "zero_optimization": zero})
    listed = [line for line in msg.splitlines() if ": unknown key" in line]
    assert len(listed) == 20
    assert "more unknown keys than the 20 listed" in msg


def test_batch_rule_products_that_overflow_name_the_keys(tmp_path):
    msg = _errors({"train_micro_batch_size_per_gpu": 2**63 - 1, "gradient_accumulation_steps": 2})
    assert (
        "train_micro_batch_size_per_gpu 9223372036854775807 * gradient_accumulation_steps 2" in msg
    )
    assert "does not fit in a 64-bit integer" in msg
    fits = {"train_micro_batch_size_per_gpu": 2**61, "gradient_accumulation_steps": 2}
    assert config.load(fits, world_size=1, log=False).train_batch_size == 2**62
    path = tmp_path / "huge.json"
    path.write_text('{"train_batch_size": 123456789012345678901234567890}')
    huge = _errors(str(path))
    assert "out of the 64-bit integer range" in huge and "fractional" not in huge


@pytest.mark.parametrize("which", ["offload_optimizer", "offload_param"])
def test_empty_or_nul_nvme_path_is_an_error_naming_the_key(which):
    for path, what in (("", "empty"), ("/tmp/a\x00b", "contains a NUL byte")):
        zero = {"stage": 3, which: {"device": "nvme", "nvme_path": path}}
        msg = _errors({"train_batch_size": 2, "zero_optimization": zero})
        assert f"zero_optimization.{which}.nvme_path: {what}" in msg


def test_a_utf8_byte_order_mark_is_skipped(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"train_batch_size": 4}).encode())
    assert config.load(str(path), world_size=2, log=False).train_batch_size == 4


def test_config_from_stdin_or_a_pipe_and_a_directory_named_as_such(tmp_path):
    read = subprocess.run(
        [sys.executable, "-c", "from zerostream import config; "
         "print(config.load('/dev/stdin', world_size=2, log=False).train_batch_size)"],
        input=json.dumps({"train_micro_batch_size_per_gpu": 3}), capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    assert read.stdout.strip().splitlines()[-1] == "6"
    msg = _errors(str(tmp_path))
    assert f"DeepSpeed config {str(tmp_path)!r} is a directory, not a config file" in msg

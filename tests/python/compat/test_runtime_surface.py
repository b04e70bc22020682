"""DeepSpeed's runtime names that code built on DeepSpeed imports, each with DeepSpeed's
behaviour (runtime_surface_worker.py gathers the facts in a subprocess that sees the
installed package): DeepSpeedConfigModel, the zero_optimization section classes, the
single-key readers, the op builders, the optimizer-wrapper classes by DeepSpeed's rule,
zero.linear and unwrap_model_for_generation. DeepSpeed's own unit tests import these at
module level (scripts/deepspeed-unit.sh)."""

import json
import pathlib

import pytest
from compat_run import run_python

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def facts(compat_env):
    done = run_python(
        [str(HERE / "workers" / "runtime_surface_worker.py")], compat_env, timeout=300
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_config_model_follows_deepspeeds_rules(facts):
    c = facts["config_model"]
    assert c["value"] == 7 and c["alias"] == [5, 6]
    assert c["auto_keeps_default"] == 3  # "auto" is left for the caller to fill
    assert c["deprecated_mapped"] == ["a"]  # through new_param_fn
    assert c["both"] == "AssertionError"
    assert c["typo"] and c["wrong_type"]  # pydantic's ValidationError


def test_zero_section_classes_validate_partial_sections(facts):
    z = facts["zero_config"]
    assert z["prefetch"] == [12345, 12345]  # DeepSpeed's field name and the JSON key
    assert z["overlap_comm"] == [False, False, False, True]  # DeepSpeed's stage rule
    assert z["no_offload"] == [None, None]
    assert z["legacy_cpu_offload"] == [True, "cpu"]  # the deprecated key, mapped
    assert z["empty_sections"] == [True, True]
    assert z["pipeline"] == [False, True]
    assert z["isinstance"] and z["param_max_in_cpu"] == 7
    assert "zero_optimization.stagee" in z["typo"] and 'did you mean "stage"' in z["typo"]
    assert z["read_only"] == "AttributeError"


def test_single_key_readers_and_defaults(facts):
    r = facts["readers"]
    assert r["clip"] == [1.0, 1.0] and r["clip_set"] == 0.0  # DeepSpeed >= 0.19.3's default
    assert r["log_level"] == [None, "info"] and r["adam"] == "adam" and r["config_error"]
    assert r["bf16"] == [True, True, False]  # "bfloat16", the old key, is read too
    assert r["fp16_window"] == 9
    assert "bf16.enabeld" in r["bf16_typo"]
    assert r["torch_version"] == [True, False]
    assert r["ckpt_names"] == [  # the files zerostream's checkpoints hold
        "tag/mp_rank_00_model_states.pt",
        "tag/zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]
    assert r["memory_report"].startswith("here\nMA ") and "CPU Virtual Memory" in r["memory_report"]
    assert r["memory_quiet"] == ""  # only with force=True
    assert r["call_to_str"] == "f(1, 'a', key=2.5)"
    assert r["clip_norm"] == [4.0, 1.0]  # the norm before clipping; after, at most max_norm
    assert r["version_names"] == [True] * 4  # DeepSpeed's version and build names


def test_op_builders_report_what_zerostream_has(facts):
    o = facts["op_builders"]
    assert o["compatible"] == {
        "cpu_adam": True,
        "cpu_adagrad": True,
        "cpu_lion": True,
        "fused_adam": True,
        "fused_lamb": False,
        "fused_lion": True,  # FusedLion in torch ops (2026-11-29)
        "async_io": True,
        "pin_memory": True,
        "utils": True,  # the byte casts
        "quantizer": False,  # ZeRO++
    }
    assert o["names"] == ["cpu_adam", "fused_lamb"]
    assert o["load"].startswith("NotImplementedError") and "DeepSpeedCPUAdam" in o["load"]
    assert o["load_missing"].startswith("RuntimeError") and "fused_lamb" in o["load_missing"]


def test_optimizer_wrapper_classes_follow_deepspeeds_choice(facts):
    w = facts["wrapper_kinds"]
    assert "BF16_Optimizer" in w["stage1_bf16_fp32_accum"]
    assert "BF16_Optimizer" not in w["stage1_bf16"]  # bf16 accumulation: the ZeRO optimizer
    assert w["stage0_bf16_client"] == ["FP16_UnfusedOptimizer"]
    assert w["stage0_bf16_adam"] == ["FP16_Optimizer"]  # config "Adam" is FusedAdam there
    assert w["stage0_fp32"] == []
    assert w["build"].startswith("TypeError") and w["not_an_optimizer"] is False


def test_zero3_linear_computes_torch_linear(facts):
    z = facts["zero_linear"]
    assert z["max_diff"] == 0.0
    assert z["autocast_dtype"] == "torch.bfloat16"  # runs in the caller's autocast
    assert z["vmap_shape"] == [6, 3] and z["grad_is_twos"]  # torch.func transforms run it


def test_unwrap_model_for_generation_gathers_then_releases(facts):
    u = facts["unwrap"]
    assert u["numel"] == [
        0,
        128,
        128,
        0,
    ]  # partitioned, whole inside (after a forward too), released
    assert u["out_shape"] == [2, 3] and u["trains_after"]


def test_leaf_module_api_and_section(facts):
    f = facts["leaf_modules"]
    assert f["marked"] == [True] and f["listed"] == 1 and f["flags"] == [False, True]
    assert f["unset"] == 1 and f["after_unset"] == 0  # by class name too
    assert f["by_name"] == ["9"] and f["by_suffix"] == 1
    assert f["none_found"].startswith("ValueError") and "Conv2d" in f["none_found"]
    assert f["section"] == ["Block"] and f["section_default"]
    assert f["model_config"] == {"classes": ["a"], "names": ["x"], "name_suffixes": []}
    # The config's section marked the block at initialize: its params, and only those.
    assert f["leaf_params"] == [False, False, True, True, True, True, False, False]


def test_pinning_backend_and_layer_partitions(facts):
    """The accelerator's is_pinned/unpin_memory (DeepSpeed's torch backend), the native
    backend (one shared NativePinnedMemory: the accelerator's pins and their views are
    pinned, unpin answers True), and runtime.utils' partition_balanced (contiguous,
    non-empty parts of near-equal sums) and partition_uniform."""
    f = facts["pinning_and_partitions"]
    assert f["is_pinned"] == [True, False] and f["unpin"] is None
    assert f["torch_backend"] is None
    assert f["native"] == ["NativePinnedMemory", True, True, True]
    sums = [
        [sum(w[b:e]) for b, e in zip(bounds[:-1], bounds[1:])]
        for w, bounds in zip(
            [[1, 2, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 1], [5, 1, 1, 9, 2]], f["balanced"]
        )
    ]
    assert sums == [[1, 2, 1, 0], [2, 1, 1, 1], [2, 1, 1, 1], [7, 11]]
    assert f["uniform"] == [[0, 4, 7, 10], [0, 1, 2, 2]]

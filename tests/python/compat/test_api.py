"""The installed `deepspeed` package on one process: the version tools accept, the classes
tools check with isinstance, what Trainer and Accelerate read from the engine and optimizer,
the features refused at initialize, and the helpers (api_worker.py gathers the facts in a
subprocess, where transformers and accelerate see the package)."""

import json
import pathlib

import pytest
from compat_run import run_python

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def facts(compat_env):
    done = run_python([str(HERE / "workers" / "api_worker.py")], compat_env, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_version_is_deepspeeds_api_level_with_zerostreams_as_local_part(facts):
    v = facts["versions"]
    assert v["metadata"] == v["module"] == f"0.19.8+zerostream.{v['zerostream']}"
    assert v["transformers_sees_it"] and v["accelerate_minimum_ok"]


@pytest.mark.parametrize("stage", ["0", "1", "2", "3"])
def test_engine_and_optimizer_are_the_classes_tools_check(facts, stage):
    s = facts["stages"][stage]
    assert s["engine_is_DeepSpeedEngine"] and s["engine_is_runtime_engine"]
    assert s["opt_is_stage_1_and_2"] == (stage in ("1", "2"))
    assert s["opt_is_stage3"] == (stage == "3")
    assert s["module_is_model"]
    assert s["returned_is_bare"] == (stage == "0")  # DeepSpeed's rule in fp32
    assert s["missing_optimizer_attributes"] == []  # reference §2.4
    assert s["norm_attribute_is_engines"] and s["state_dict_is_dict"]
    assert s["partition_weights"] == (stage == "3")
    assert s["gather_16bit_on_save"] is False  # the config's default
    assert s["boundary_after_set"] is True
    assert s["loss_scale"] == s["cur_scale"] == 1.0 and s["overflow"] is False
    assert s["lr"] == pytest.approx(1e-2)
    # Pre-clip global norm, as DeepSpeed reports it, against plain torch's.
    assert s["grad_norm_is_tensor"]
    assert s["grad_norm"] == pytest.approx(facts["reference_grad_norm"], rel=1e-5)


@pytest.mark.parametrize(
    "key,named",
    [
        ("zero_quantized_weights", "ZeRO++ quantized weights"),
        ("zero_quantized_gradients", "ZeRO++ quantized gradients"),
        ("zero_hpz_partition_size", "hierarchical weight partitioning"),
        ("mics_shard_size", "MiCS"),
        ("zenflow", "ZenFlow at ZeRO stage 3"),
        ("offload_optimizer", "offload_optimizer.super_offload: SuperOffload"),
        ("deepcompile", "compile.deepcompile: DeepCompile"),
        ("expert_params", "expert parallelism"),
        ("moe_layer", "expert parallelism"),
        ("tp_model_init", "tensor parallelism"),
        ("engine_compile", "torch.compile"),
    ],
)
def test_unsupported_features_fail_at_setup_naming_them(facts, key, named):
    message = facts["unsupported"][key]
    assert message.startswith("NotImplementedError: "), message
    assert named in message
    if key.startswith(("zero_", "mics", "zenflow", "offload_")):
        assert f"zero_optimization.{key}" in message


def test_moe_param_group_helper(facts):
    u = facts["unsupported"]
    # One expert weight moved to a group of its own, named by its expert group.
    assert u["moe_groups"] == [["dense", False, 3], ["ep_size_2", True, 1]]
    # Without expert parameters the groups come back unchanged (cifar10_deepspeed.py).
    assert u["split_without_experts"] == [["dense", 4]]


def test_fused_adam_trains_like_torch_adamw(facts):
    f = facts["fused_adam"]
    assert f["fused"] == pytest.approx(f["torch"], rel=1e-6, abs=1e-7)


def test_helpers(facts):
    h = facts["helpers"]
    assert h["clone_equal"] and h["clone_kinds"] == ["list", "tuple", "x"]
    # A view of 10 floats saved alone, not its 10000-float storage.
    assert h["clone_bytes"] < h["view_bytes"] / 5
    assert h["config_isinstance"] and h["config_stage"] == 2
    assert "train_batch_size" in h["config_bad"]
    assert h["zero_is_runtime_zero"]
    assert h["steps_per_print_inf"] is None  # never print, as DeepSpeed's default
    z = h["zero_utils"]
    assert "zero_force_ds_cpu_optimizer" in z["caught"], z  # caught as DeepSpeed's type
    assert z["supported"] == [True, True, False] and z["zero_param"] is False


def test_save_16bit_model_at_stage3(facts):
    on, off = facts["save_16bit"]["True"], facts["save_16bit"]["False"]
    assert on == {"returned": True, "files": ["model.bin"], "equal_to_initial": True}
    assert off == {"returned": False, "files": [], "equal_to_initial": None}

"""The `deepspeed` compatibility package provides every DeepSpeed name the pinned transformers,
accelerate and PyTorch Lightning use (found by reading their installed sources,
import_surface.py), the names issue 15 and DeepSpeed's own example scripts need, and refuses
the rest by name.

A transformers or accelerate upgrade that starts using a new DeepSpeed name fails here until
the package provides it (or refuses it clearly, or it is listed in NOT_NEEDED with why)."""

import json
import pathlib

import import_surface
from compat_run import run_python

HERE = pathlib.Path(__file__).resolve().parent

# Used by the tools but deliberately not provided, with the reason.
NOT_NEEDED = {
    "deepspeed.utils.is_initialized": (
        "transformers' esmfold calls it only when DeepSpeed is *not* available (an inverted "
        "check) and inside `except Exception`; DeepSpeed 0.19.8 has no such function either"
    ),
}

# Module paths the package refuses on import or, for deepspeed.pipe's classes, when built
# (UnsupportedFeatureError naming the feature), with the feature named.
REFUSED_MODULES = {
    "deepspeed.runtime.sequence_parallel.ulysses_sp": "sequence parallelism",
    "deepspeed.pipe": "pipeline parallelism",
}
# Refused names that scripts import (not the tools): they must stay refused clearly.
REQUIRED_REFUSED = ["deepspeed.pipe.PipelineModule", "deepspeed.pipe.LayerSpec"]

# Issue 15's list and what DeepSpeed's cifar10_deepspeed.py and
# tests/small_model_debugging/test_model.py import, beyond the tools' own uses.
REQUIRED = [
    "deepspeed.initialize",
    "deepspeed.init_distributed",
    "deepspeed.add_config_arguments",
    "deepspeed.DeepSpeedEngine",
    "deepspeed.DeepSpeedConfig",
    "deepspeed.runtime.engine.DeepSpeedEngine",
    "deepspeed.runtime.config.DeepSpeedConfig",
    "deepspeed.runtime.lr_schedules.WarmupLR",
    "deepspeed.runtime.lr_schedules.WarmupDecayLR",
    "deepspeed.runtime.lr_schedules.WarmupCosineLR",
    "deepspeed.runtime.lr_schedules.OneCycle",
    "deepspeed.runtime.lr_schedules.LRRangeTest",
    "deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer",
    "deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3",
    "deepspeed.runtime.zero.partition_parameters.Init",
    "deepspeed.runtime.zero.partition_parameters.GatheredParameters",
    "deepspeed.runtime.zero.partition_parameters.MultipleAllGatherHandles",
    "deepspeed.runtime.zero.partition_parameters.partitioned_param_data_shape",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.zero.utils.ZeRORuntimeException",
    "deepspeed.runtime.zero.utils.is_zero_param",
    "deepspeed.runtime.zero.offload_config.OffloadDeviceEnum",
    "deepspeed.zero.Init",
    "deepspeed.zero.GatheredParameters",
    "deepspeed.zero.register_external_parameter",
    "deepspeed.zero.unregister_external_parameter",
    "deepspeed.ops.adam.DeepSpeedCPUAdam",
    "deepspeed.ops.adam.FusedAdam",
    "deepspeed.ops.lion.DeepSpeedCPULion",
    "deepspeed.ops.adagrad.DeepSpeedCPUAdagrad",
    "deepspeed.accelerator.get_accelerator",
    "deepspeed.utils.logger",
    "deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint",
    "deepspeed.utils.zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict",
    "deepspeed.utils.zero_to_fp32.load_state_dict_from_zero_checkpoint",
    "deepspeed.checkpoint.utils.clone_tensors_for_torch_save",
    "deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer",
    "deepspeed.moe.layer.MoE",
    "deepspeed.launcher.runner.main",
    "deepspeed.env_report.cli_main",
] + [
    f"deepspeed.comm.{name}"
    for name in (
        "get_rank get_world_size get_local_rank get_global_rank barrier monitored_barrier "
        "broadcast broadcast_object_list all_reduce all_reduce_coalesced reduce all_gather "
        "all_gather_object all_gather_into_tensor allgather_fn reduce_scatter "
        "reduce_scatter_tensor reduce_scatter_fn all_to_all_single all_to_all send recv "
        "isend irecv gather scatter new_group get_world_group is_initialized "
        "destroy_process_group ReduceOp log_summary init_distributed"
    ).split()
]

# DeepSpeed's own exports that training code reaches for, beyond the tools' uses (the
# docs/compat.md rows for the param helpers, OnDevice and the memory estimators), and what
# DeepSpeed's unit-test helpers import (unit/util.py, unit/simple_model.py: without them no
# test file of DeepSpeed's suite imports at all).
EXPORTS = [
    "deepspeed.accelerator.is_current_accelerator_supported",
    "deepspeed.accelerator.cpu_accelerator.CPU_Accelerator",
    "deepspeed.accelerator.cuda_accelerator.CUDA_Accelerator",
    "deepspeed.git_version_info.torch_info",
    "deepspeed.runtime.zero.offload_config.OffloadStateTypeEnum",
    "deepspeed.runtime.zero.offload_states.get_state_devices",
    "deepspeed.runtime.lr_schedules.LR_RANGE_TEST_MIN_LR",
    "deepspeed.runtime.lr_schedules.WARMUP_MAX_LR",
    "deepspeed.runtime.base_optimizer.ZeROOptimizer",
    "deepspeed.OnDevice",
    "deepspeed.utils.OnDevice",
    "deepspeed.utils.init_on_device.OnDevice",
    "deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs_all_live",
    "deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold",
    "deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs_all_live",
    "deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs_all_cold",
] + [
    f"deepspeed.utils{module}.safe_{verb}_{scope}_{what}"
    for module in ("", ".tensor_fragment")
    for verb in ("get", "set")
    for scope in ("full", "local")
    for what in ("fp32_param", "optimizer_state", "grad")
]


def test_the_scan_finds_each_kind_of_use_and_nothing_else():
    """The reader itself, on a source with every kind of use and lookalikes that are not."""
    source = (
        "import deepspeed\n"
        "from deepspeed.ops.adam import DeepSpeedCPUAdam as Adam\n"
        "from deepspeed import comm as dist\n"
        "def f(self):\n"
        "    import deepspeed.runtime.zero.partition_parameters as pp\n"
        "    deepspeed.zero.GatheredParameters(x)\n"
        "    pp.zero_wrapper_for_fp_tensor_constructor\n"
        "    self.deepspeed.config.get('x')\n"
        "    return 'deepspeed.not_a_use', dist.get_rank()\n"
        "def g(pp):\n"
        "    return pp.unrelated  # another scope's alias\n"
    )
    got = {(u.path, u.kind) for u in import_surface.uses_in_source(source, "x.py")}
    assert got == {
        ("deepspeed", "import"),
        ("deepspeed.ops.adam.DeepSpeedCPUAdam", "from"),
        ("deepspeed.comm", "from"),
        ("deepspeed.runtime.zero.partition_parameters", "import"),
        ("deepspeed.zero.GatheredParameters", "attr"),
        (
            "deepspeed.runtime.zero.partition_parameters.zero_wrapper_for_fp_tensor_constructor",
            "attr",
        ),
        ("deepspeed.comm.get_rank", "attr"),
    }


def test_every_name_the_tools_and_scripts_use_resolves(compat_env, tmp_path):
    uses = import_surface.scan()
    found = {u.path for u in uses}
    # The scan sees what the tools are known to use; an empty scan would pass vacuously.
    for path in (
        "deepspeed.initialize",
        "deepspeed.zero.GatheredParameters",
        "deepspeed.comm",
        "deepspeed.checkpointing.configure",  # PyTorch Lightning's
    ):
        assert path in found, f"the scan no longer finds {path}: is the reader broken?"
    stale = sorted(set(NOT_NEEDED) - found)
    assert not stale, f"NOT_NEEDED lists names the tools no longer use: {stale}"

    todo = {(u.path, u.kind, u.root) for u in uses if u.path not in NOT_NEEDED}
    todo |= {(path, "from", path) for path in REQUIRED + EXPORTS + REQUIRED_REFUSED}
    spec = tmp_path / "uses.json"
    spec.write_text(json.dumps(sorted(todo)))
    done = run_python(
        [str(HERE / "workers" / "surface_check.py"), str(spec)], compat_env, timeout=300
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])

    where = {}
    for u in uses:
        where.setdefault(u.path, u.where)
    missing = {
        p: f"{r} (used at {where.get(p, 'REQUIRED')})"
        for p, r in result.items()
        if r.startswith("missing")
    }
    assert not missing, "names the compat package does not provide:\n" + "\n".join(
        f"  {p}: {r}" for p, r in sorted(missing.items())
    )
    refused = {p: r for p, r in result.items() if r.startswith("refused")}
    for path in REQUIRED_REFUSED:
        assert path in refused, f"{path} must be refused clearly, got {result[path]}"
    for path, reason in refused.items():
        module = next((m for m in REFUSED_MODULES if path.startswith(m)), None)
        assert module is not None, f"refused outside REFUSED_MODULES: {path}: {reason}"
        assert "not supported by zerostream" in reason, (path, reason)
        assert REFUSED_MODULES[module] in reason, (path, reason)
    assert len(result) == len({p for p, _, _ in todo})

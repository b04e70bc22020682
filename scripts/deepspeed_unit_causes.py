"""Why each DeepSpeed unit test that fails on zerostream fails: (class, test-id regex,
message regex, cause). First match wins; a file that cannot be imported is one record whose
id is the module (`::unit.runtime.zero.test_zero_context`).

Classes: "cuda" (no package passes it on a CPU: DeepSpeed's own CPU accelerator fails it
too), "internal" (it reads a private DeepSpeed name, which the cause names; zerostream
does not reproduce DeepSpeed's internals), "failed" (the package's fault: still to fix, or
refused by design, as the cause says). Found at DeepSpeed edaa722.
"""

CAUSES: list[tuple[str, str, str, str]] = [
    # Files that import a private name at module level.
    ("internal", r"test_zero_init_pg_contradiction", r"_contradicting_single_rank_pg_error",
     "imports partition_parameters._contradicting_single_rank_pg_error (private)"),
    ("internal", r"test_zero_linear_direct_init", r"InsertPostInitMethodToModuleSubClasses",
     "imports partition_parameters.InsertPostInitMethodToModuleSubClasses and checks its "
     "F.linear patch (zerostream's zero.Init patches nothing)"),
    ("internal", r"test_zero_late_module_attach", r"parameter_offload|ZeROOrderedDict",
     "imports parameter_offload.ZeROOrderedDict (DeepSpeed's _parameters dict)"),
    ("internal", r"test_zero_tiled", r"zero\.tiling",
     "imports runtime.zero.tiling (TiledLinear: not built)"),
    ("internal", r"test_zero_autocast_mixed_dtype", r"get_allgather_dtype",
     "imports partition_parameters.get_allgather_dtype (DeepSpeed's gather-dtype rule)"),
    ("failed", r".", r"FrozenInstanceError: cannot assign to field",
     "assigns to the resolved DeepSpeedConfig, which zerostream keeps frozen (a mutable "
     "DeepSpeedConfig is open)"),
    # Tests that read DeepSpeed's optimizer or engine internals.
    ("internal", r".", r"has no attribute 'nccl_start_alignment_factor'",
     "reads optimizer.nccl_start_alignment_factor"),
    ("internal", r".", r"has no attribute 'fp32_groups_gradients_flat'",
     "reads BF16_Optimizer.fp32_groups_gradients_flat"),
    ("internal", r".", r"has no attribute '(forward_hooks|backward_hooks|parameter_offload)'",
     "reads the stage-3 optimizer's forward_hooks/parameter_offload"),
    ("internal", r"test_cpu_adam", r"CPUAdamBuilder\(\)\.load\(\)",
     "calls the raw cpu_adam op module (CPUAdamBuilder().load().create_adam, zenflow_*)"),
    ("internal", r".", r"has no attribute '(averaged_gradients|get_fp32_grad_partitions|"
     r"grad_partitions_flat_buffer)'",
     "reads a private optimizer/engine attribute (the message names it)"),
    ("internal", r".", r"has no attribute '(ds_active_sub_modules|accumulated_grads_in_cpu|"
     r"needs_scaler|fp32_partitioned_groups_flat|_get_norm_groups|"
     r"_is_gradient_accumulation_boundary)'",
     "reads a private optimizer/engine/param attribute (the message names it)"),
    ("internal", r".", r"has no attribute 'count_used_parameters_in_backward'",
     "reads runtime.utils.count_used_parameters_in_backward (DeepSpeed's hook bookkeeping)"),
    ("internal", r".", r"has no attribute '_backward_epilogue'",
     "calls the engine's private _backward_epilogue after its own loss.backward()"),
    ("internal", r".", r"has no attribute '_\w+'",
     "reads a private name (a leading underscore; the message names it)"),
    ("internal", r"TestCoalesceCollectiveCount", r"baseline issued no collectives",
     "counts DeepSpeed's reducer's calls by patching deepspeed.comm.all_reduce/reduce/"
     "reduce_scatter_fn; zerostream's reducers call zerostream.comm (its telemetry counts "
     "them: tests/python/engine/test_coalesce_and_plain_backward.py)"),
    ("internal", r"test_zero_activation_checkpoint_lifecycle", r"F\.linear is zero3_linear_wrap",
     "asserts DeepSpeed's F.linear patch (zero3_linear_wrap installed globally by its "
     "engine; zerostream patches nothing) and its private _z3_leaf flag"),
    ("internal", r"test_zero_hook_attribute_delegation", r"pre_bwd_fn",
     "inspects DeepSpeed's backward-hook wrapper object (pre_bwd_fn in its __dict__)"),
    ("internal", r"TestZero3ParamPartitioningLargeParam", r"allreduce_gradients|averaged_grad",
     "calls engine.allreduce_gradients() and reads optimizer.averaged_gradients (DeepSpeed's "
     "reduction internals; zerostream reduces in backward or step)"),
    ("internal", r"test_activation_checkpointing", r"PARTITION_ACTIVATIONS",
     "reads deepspeed.checkpointing's module globals (PARTITION_ACTIVATIONS, num_layers, "
     "...), DeepSpeed's internal state"),
    ("internal", r"test_ext_param_return", r"_external_params",
     "reads modules' private _external_params dicts"),
    ("failed", r"test_multi_bucket_flush\[[23]\]", r"max-abs-diff",
     "by design, rounding: zerostream adds each backward's reduced gradients into fp32 "
     "partitions, a coalesced block sums in bf16 before its one reduction (as DeepSpeed's), "
     "so the two runs differ by one bf16 step where Adam's eps dominates; DeepSpeed's "
     "baseline also accumulates in bf16, so its two runs round alike"),
    # Refused or done differently by design.
    ("failed", r"test_zero1_no_offload_uses_bf16_optimizer", r"DID NOT RAISE|Timeout",
     "by design: coalesce_grad_reduction works at ZeRO-1 in bf16 with fp32 accumulation "
     "(DeepSpeed refuses it for its BF16_Optimizer wrapper)"),
    ("failed", r"TestZero0DirectBackwardStillRaises", r"TimeoutError|DID NOT RAISE",
     "by design: a plain loss.backward() works at stage 0 too (DeepSpeed refuses it there; "
     "its harness reports the missing exception as a timeout)"),
    ("failed", r"TestMuonRejectsReduceScatter", r"TimeoutError|DID NOT RAISE|hanged",
     "by design: Muon with reduce_scatter and offload_optimizer cpu runs (zerostream gathers "
     "each matrix from the reduced partitions whatever the reduction; DeepSpeed refuses the "
     "combination; its harness reports the missing exception as a timeout)"),
    ("failed", r"test_unmanaged_rejects_overlap_comm", r"TimeoutError|DID NOT RAISE",
     "by design: overlap_comm is accepted at stages 0/1 with managed_gradient_accumulation "
     "false, where zerostream reduces at the step anyway (DeepSpeed refuses; its harness "
     "reports the missing exception as a timeout)"),
    ("cuda", r"TestCPU(Adam|Lion)GPUError", r".",
     "puts params on the accelerator (device_name(0)) and expects the CPU optimizer to refuse "
     "them: on a CPU machine that device is the host, so no package raises"),
    # Not built yet.
    ("failed", r".", r"zero_optimization\.zenflow",
     "not built yet: ZenFlow beyond stages 1-2 with offload_optimizer cpu (stage 3, "
     "update_interval \"auto\", fp16, its checkpoints: refused by key)"),
    ("failed", r".", r"activation_checkpointing\.offload_activations",
     "not built yet: DeepSpeed's activation offloading module"),
    # Refused by design, by name.
    ("failed", r".",
     r"Mixture-of-Experts with expert parallelism|deepspeed\.runtime\.pipe|_create_expert",
     "a DeepSpeed feature zerostream refuses by name (expert or pipeline parallelism)"),
    ("failed", r"TestCometMonitor", r"No module named 'comet_ml'",
     "imports comet_ml itself, which zerostream does not pin (its Comet writer logs through "
     "it when installed; tests/python/monitor/test_writers.py checks the calls)"),
    ("failed", r"test_fp16_loss_scale_accepts_valid_values\[3\]", r"ValidationError",
     "by design: a numeric string (\"3\") for fp16.loss_scale; zerostream's schema takes "
     "numbers only, in a config file as in DeepSpeedFP16Config (DeepSpeed's pydantic coerces)"),
    ("failed", r"test_fp16_loss_scale_invalid_type_has_clear_error", r"must be a number",
     "by design, wording: the error names the key and says 'fp16.loss_scale: expected a "
     "number; got []' (the schema's words for every number key), not DeepSpeed's 'must be a "
     "number'"),
    # Different error types for the same refusal.
    # The CPU cannot show what the test measures.
    ("cuda", r"test_offload_states", r"should decrease after offload",
     "measures device memory_allocated() before and after offload_states(device='cpu'): on "
     "a CPU machine the device is the host, so nothing can drop"),
    ("cuda", r".", r"DistributedDataParallel device_ids and output_device arguments only work",
     "builds its DDP reference with device_ids=[current_device()] around a CPU module, which "
     "torch refuses for every accelerator's CPU device"),
    ("cuda", r".", r"DeepSpeed BFloat16 tests need torch >= 1.10, NCCL >= 2.10.3, CUDA",
     "DeepSpeed's bf16 test helper wants a torch built with CUDA >= 11 and NCCL >= 2.10 (it "
     "reads git_version_info.torch_info): a CPU-only torch fails it for every package"),
    ("cuda", r".", r"Found no NVIDIA driver|Torch not compiled with CUDA|CUDA is not available",
     "places a tensor on CUDA directly"),
    # Written by the runner (deepspeed_unit._write_hung), after the by-design entries above
    # that expect a timeout.
    ("failed", r".", r"TimeoutError: hung:",
     "hung: its ranks were not done within the timeout (DeepSpeed's harness then ends the "
     "session; the runner goes on without the test)"),
]  # fmt: skip

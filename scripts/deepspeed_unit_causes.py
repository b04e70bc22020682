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
    ("internal", r"test_zero_context\b", r"MultipleAllGatherHandles",
     "imports partition_parameters.MultipleAllGatherHandles (DeepSpeed's gather handles)"),
    ("internal", r"test_zero_linear_direct_init", r"InsertPostInitMethodToModuleSubClasses",
     "imports partition_parameters.InsertPostInitMethodToModuleSubClasses and checks its "
     "F.linear patch (zerostream's zero.Init patches nothing)"),
    ("internal", r"test_zero_late_module_attach", r"parameter_offload|ZeROOrderedDict",
     "imports parameter_offload.ZeROOrderedDict (DeepSpeed's _parameters dict)"),
    ("internal", r"test_zero_tiled", r"zero\.tiling",
     "imports runtime.zero.tiling (TiledLinear: not built)"),
    ("failed", r"test_zero_leaf_module", r"leaf_module|z3_leaf|leaf modules",
     "ZeRO-3 leaf modules (before they were built: the run's commit refused them)"),
    ("internal", r"test_zero_autocast_mixed_dtype", r"get_allgather_dtype",
     "imports partition_parameters.get_allgather_dtype (DeepSpeed's gather-dtype rule)"),
    ("internal", r".", r"has no attribute '_param_dict'",
     "reads DeepSpeedConfig._param_dict (the config's private copy of the dict)"),
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
     r"grad_partitions_flat_buffer|_get_optimizer_ckpt_name|sparse_tensor_module_names)'",
     "reads a private optimizer/engine attribute (the message names it)"),
    ("internal", r".", r"has no attribute '(ds_active_sub_modules|accumulated_grads_in_cpu|"
     r"needs_scaler|fp32_partitioned_groups_flat|_get_norm_groups|"
     r"_is_gradient_accumulation_boundary)'",
     "reads a private optimizer/engine/param attribute (the message names it)"),
    ("internal", r".", r"has no attribute 'count_used_parameters_in_backward'",
     "reads runtime.utils.count_used_parameters_in_backward (DeepSpeed's hook bookkeeping)"),
    ("internal", r".", r"has no attribute '_backward_epilogue'",
     "calls the engine's private _backward_epilogue after its own loss.backward()"),
    ("failed", r".", r"received a gradient outside engine.backward",
     "a plain loss.backward() at ZeRO stage 2 or 3 is refused (DeepSpeed 0.17+ takes it and "
     "reduces in its backward epilogue): open"),
    ("internal", r".", r"has no attribute '_\w+'",
     "reads a private name (a leading underscore; the message names it)"),
    # Not built yet.
    ("failed", r".", r"has no attribute 'coalesce_grad_reduction'|coalesce_grad_reduction",
     "engine.coalesce_grad_reduction() (one reduction for several backwards at ZeRO 1-3) is "
     "not built"),
    ("failed", r".", r"has no attribute 'allreduce_gradients'",
     "engine.allreduce_gradients() is not built (zerostream reduces inside backward/step)"),
    # Refused by design, by name.
    ("failed", r".", r"set_gradient_accumulation_boundary: not allowed with "
     r"managed_gradient_accumulation false",
     "refused by design: with managed_gradient_accumulation false the caller owns the "
     "boundary through step()"),
    ("failed", r".", r"no_sync is not compatible with ZeRO stage 2",
     "refused by design: zerostream's stage 2 reduces gradients as they are produced"),
    ("failed", r".",
     r"Mixture-of-Experts with expert parallelism|deepspeed\.runtime\.pipe|_create_expert",
     "a DeepSpeed feature zerostream refuses by name (expert or pipeline parallelism)"),
    # Different error types for the same refusal.
    ("failed", r"TestIncorectAllgatherBucketSize", r"allgather_bucket_size",
     "refused at config time with a ValueError naming the key; DeepSpeed's test expects its "
     "AssertionError at optimizer construction"),
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
    ("failed", r".", r"comparing engine.backward vs engine.scale\(\).backward\(\)",
     "after a plain loss.backward() (engine.scale), safe_get_full_grad answers None: the "
     "gradient helpers hold gradients only between engine.backward and step (open)"),
    ("cuda", r".", r"Found no NVIDIA driver|Torch not compiled with CUDA|CUDA is not available",
     "places a tensor on CUDA directly"),
]  # fmt: skip

"""Which of DeepSpeed's unit test files scripts/deepspeed_unit.py runs: every `test_*.py`
under `tests/unit`, except OUT_OF_SCOPE.

OUT_OF_SCOPE names only DeepSpeed features zerostream refuses by name (docs/compat.md says
where), one reason per entry; an entry ending in "/" takes a whole folder. Everything else
is in, whether zerostream passes it or not: ZeRO and offload, NVMe and pinned memory, the
optimizers (Muon and ZenFlow too: ZenFlow counts as failures until it is built), launchers,
monitors, the flops profiler, the comms logger, elasticity, the data loader, precision,
checkpoints (universal ones too). What the denominator is, DeepSpeed's own run on the same
machine decides (deepspeed_unit_compare.py), not this list.

Checked against DeepSpeed edaa722 (every entry exists there:
tests/python/compat/test_deepspeed_unit_script.py).
"""

from __future__ import annotations

from pathlib import Path

OUT_OF_SCOPE: list[tuple[str, str]] = [
    # Pipeline parallelism (deepspeed.pipe: refused when a PipelineModule is built)
    ("unit/pipe/", "pipeline parallelism"),
    ("unit/runtime/pipe/", "pipeline parallelism"),
    ("unit/checkpoint/test_pipeline.py", "pipeline parallelism (PipelineModule checkpoints)"),
    ("unit/checkpoint/test_reshape_checkpoint.py",
     "checkpoints re-cut across pipeline and tensor-parallel degrees (3D descriptors, AutoEP)"),
    ("unit/model_parallelism/", "tensor (AutoTP, Megatron mpu) and pipeline parallelism"),
    # Tensor parallelism and AutoTP (tensor_parallel.autotp_size > 1: refused at setup)
    ("unit/module_inject/", "AutoTP sharding and TP plans"),
    ("unit/runtime/tensor_parallel/", "AutoTP (its universal checkpoints)"),
    ("unit/runtime/test_tp_plan_extraction.py", "AutoTP plans"),
    ("unit/checkpoint/test_autotp_uc_checkpoint.py", "AutoTP universal checkpoints"),
    # MoE and expert parallelism (refused naming expert parallelism)
    ("unit/v1/moe/", "MoE, AutoEP and expert parallelism"),
    ("unit/checkpoint/test_moe_checkpoint.py", "MoE checkpoints"),
    ("unit/utils/test_groups.py", "expert-parallel rank groups (_get_expert_parallel_ranks)"),
    ("unit/v1/ops/triton_ops/", "Triton group-GEMM and SwiGLU kernels of AutoEP's experts"),
    # Inference (init_inference: refused naming DeepSpeed-Inference)
    ("unit/inference/", "DeepSpeed-Inference v1 and v2, their kernels and quantization"),
    ("unit/ops/transformer/", "inference transformer kernels"),
    ("unit/ops/spatial/", "inference spatial kernels (nhwc_bias_add)"),
    # DeepCompile and torch.compile passes (compile.deepcompile, engine.compile: refused)
    ("unit/compile/", "DeepCompile and torch.compile passes"),
    ("unit/v1/compile/", "DeepCompile and torch.compile passes"),
    # Compression and quantization
    ("unit/compression/", "compression (quantization, pruning, layer reduction)"),
    ("unit/ops/quantizer/", "quantization kernels"),
    ("unit/ops/fp_quantizer/", "fp8 and fp quantizer kernels"),
    ("unit/runtime/half_precision/test_fp8.py", "fp8 training (Transformer Engine layers)"),
    ("unit/linear/", "deepspeed.linear (quantized LoRA linear layers)"),
    # Sequence parallelism (sp_backend "deepspeed": refused at setup)
    ("unit/sequence/", "Ulysses sequence parallelism (deepspeed.sequence.layer)"),
    ("unit/sequence_parallelism/", "Ulysses and AutoSP sequence parallelism"),
    ("unit/ulysses_alst/", "Ulysses/ALST sequence parallelism and tiled compute"),
    # The hybrid engine and rollout
    ("unit/hybrid_engine/", "the hybrid engine"),
    ("unit/runtime/rollout/", "hybrid-engine rollout"),
    # Sparse attention and the transformer and Evoformer kernels
    ("unit/ops/sparse_attention/", "sparse attention kernels"),
    ("unit/ops/accelerators/", "the DeepSpeedTransformerLayer training kernel"),
    ("unit/ops/deepspeed4science/", "DS4Sci Evoformer attention kernel"),
    # 1-bit optimizers and sparse tensors
    ("unit/runtime/half_precision/onebit/", "1-bit Adam, 0/1 Adam and 1-bit LAMB"),
    ("unit/runtime/sparse_tensor/", "sparse gradients and CSR tensors"),
    ("unit/checkpoint/test_sparse.py", "sparse gradients (sparse embedding checkpoints)"),
    # ZeRO++ and MiCS (zero_quantized_*, zero_hpz_partition_size, mics_shard_size: refused)
    ("unit/runtime/zero/test_zeropp.py", "ZeRO++ (quantized weights/gradients, hpZ)"),
    ("unit/checkpoint/test_mics_optimizer.py", "MiCS"),
    # Autotuning, data efficiency, progressive layer drop
    ("unit/autotuning/", "the autotuner"),
    ("unit/runtime/test_data_efficiency.py", "data efficiency (curriculum, random-LTD)"),
    ("unit/runtime/test_pld.py", "progressive layer drop"),
    # Not a test of the package: it loads <checkout>/op_builder/builder.py by file path
    # (DeepSpeed's CUDA JIT build flags), which a tests-only copy lacks, so no installed
    # package, DeepSpeed's included, can import it there.
    ("unit/ops/test_op_builder.py", "DeepSpeed's CUDA op-builder source, loaded by path"),
]

# Run last, the longest files (hours together on 2 cores; test_offload_states.py is 128
# variants of one test), so that a run stopped part way has covered every other file.
LAST = [
    "unit/ops/muon/test_muon.py",
    "unit/runtime/zenflow/test_zf.py",
    "unit/checkpoint/test_universal_checkpoint.py",
    "unit/checkpoint/test_zero_optimizer.py",
    "unit/v1/zero/test_zero.py",
    "unit/v1/zero/test_offload_states.py",
]


def out_of_scope(path: str) -> str | None:
    """The reason `path` (relative to tests/) is not run, or None."""
    for entry, why in OUT_OF_SCOPE:
        if path == entry or (entry.endswith("/") and path.startswith(entry)):
            return why
    return None


def in_scope_files(tests: Path) -> list[str]:
    """Every test file under `tests`/unit not OUT_OF_SCOPE, as paths relative to `tests`,
    sorted, LAST at the end."""
    found = sorted(p.relative_to(tests).as_posix() for p in (tests / "unit").rglob("test_*.py"))
    files = [f for f in found if out_of_scope(f) is None]
    return [f for f in files if f not in LAST] + [f for f in LAST if f in files]


def stale_entries(tests: Path) -> list[str]:
    """OUT_OF_SCOPE entries that name nothing under `tests` (a file or folder renamed)."""
    return [entry for entry, _ in OUT_OF_SCOPE if not (tests / entry.rstrip("/")).exists()]

"""DeepSpeed's runtime names that code built on DeepSpeed (and DeepSpeed's own tests) imports:
config classes and readers, op builders, the optimizer-wrapper classes, zero.linear and
unwrap_model_for_generation (run by test_runtime_surface.py in a subprocess with the
installed package). Prints one JSON object of plain facts."""

import json
from typing import List, Optional

import deepspeed
import torch
from pydantic import Field, ValidationError


def _error(fn) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001  (the type is the fact)
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def config_model():
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel

    class Section(DeepSpeedConfigModel):
        size: int = 3
        names_old: Optional[str] = Field(
            None,
            json_schema_extra={
                "deprecated": True,
                "new_param": "names",
                "new_param_fn": lambda x: [x],
            },
        )
        names: Optional[List[str]] = None
        width: int = Field(0, alias="width_alias")

    return {
        "value": Section(size=7).size,
        "auto_keeps_default": Section(size="auto").size,
        "deprecated_mapped": Section(names_old="a").names,
        "alias": [Section(width=5).width, Section(width_alias=6).width],
        "both": _error(lambda: Section(names=["a"], names_old="b")).split(":")[0],
        "typo": isinstance(_catch(lambda: Section(sizes=1)), ValidationError),
        "wrong_type": isinstance(_catch(lambda: Section(size="x")), ValidationError),
    }


def _catch(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return exc
    return None


def zero_config():
    from deepspeed.runtime.zero.config import (
        DeepSpeedZeroConfig,
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    z = DeepSpeedZeroConfig(stage3_prefetch_bucket_size=12345, stage=3)
    legacy = DeepSpeedZeroConfig(cpu_offload=True, stage=2)
    empty = DeepSpeedZeroConfig(offload_param={}, offload_optimizer={})
    return {
        "prefetch": [z.prefetch_bucket_size, z.stage3_prefetch_bucket_size],
        "overlap_comm": [DeepSpeedZeroConfig(stage=s).overlap_comm for s in range(4)],
        "no_offload": [
            DeepSpeedZeroConfig().offload_param,
            DeepSpeedZeroConfig().offload_optimizer,
        ],
        "legacy_cpu_offload": [
            isinstance(legacy.offload_optimizer, DeepSpeedZeroOffloadOptimizerConfig),
            legacy.offload_optimizer.device,
        ],
        "empty_sections": [
            isinstance(empty.offload_param, DeepSpeedZeroOffloadParamConfig),
            isinstance(empty.offload_optimizer, DeepSpeedZeroOffloadOptimizerConfig),
        ],
        "pipeline": [
            DeepSpeedZeroOffloadOptimizerConfig().pipeline,
            DeepSpeedZeroOffloadOptimizerConfig(pipeline_write=True).pipeline,
        ],
        "isinstance": isinstance(z, DeepSpeedZeroConfig),
        "typo": _error(lambda: DeepSpeedZeroConfig(stagee=1)),
        "read_only": _error(lambda: setattr(z, "stage", 1)).split(":")[0],
        "param_max_in_cpu": DeepSpeedZeroOffloadParamConfig(max_in_cpu=7).max_in_cpu,
    }


def readers():
    from deepspeed.checkpoint.utils import get_model_ckpt_name_for_rank, get_zero_ckpt_name_for_rank
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT
    from deepspeed.runtime.precision_config import get_bfloat16_config, get_float16_config
    from deepspeed.runtime.utils import call_to_str, see_memory_usage
    from deepspeed.utils.torch import required_torch_version

    return {
        "clip": [ds_config.get_gradient_clipping({}), GRADIENT_CLIPPING_DEFAULT],
        "clip_set": ds_config.get_gradient_clipping({"gradient_clipping": 0.0}),
        "log_level": [ds_config.get_log_level({}), ds_config.get_log_level({"log_level": "info"})],
        "adam": ds_config.ADAM_OPTIMIZER,
        "config_error": deepspeed.DeepSpeedConfigError is ds_config.DeepSpeedConfigError,
        "bf16": [
            get_bfloat16_config({"bf16": {"enabled": True}}).enabled,
            get_bfloat16_config({"bfloat16": {"enabled": True}}).enabled,
            get_bfloat16_config({}).enabled,
        ],
        "fp16_window": get_float16_config({"fp16": {"loss_scale_window": 9}}).loss_scale_window,
        "bf16_typo": _error(lambda: get_bfloat16_config({"bf16": {"enabeld": True}})),
        "torch_version": [
            required_torch_version(min_version=1.0),
            required_torch_version(max_version=1.0),
        ],
        "ckpt_names": [
            get_model_ckpt_name_for_rank("tag", "00"),
            get_zero_ckpt_name_for_rank("tag", 1, 0),
        ],
        "memory_report": _printed(lambda: see_memory_usage("here", force=True)),
        "memory_quiet": _printed(lambda: see_memory_usage("here")),
        "call_to_str": call_to_str("f", 1, "a", key=2.5),
        "clip_norm": _clip(),
        "version_names": [
            hasattr(deepspeed, n)
            for n in ("__git_hash__", "__git_branch__", "__version_major__", "__version_patch__")
        ],
    }


def _clip():
    from deepspeed.runtime.utils import clip_grad_norm_

    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.full((4,), 2.0)
    norm = clip_grad_norm_([p], 1.0)
    return [round(float(norm), 5), round(float(p.grad.norm()), 5)]


def _printed(fn) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn()
    return out.getvalue()


def op_builders():
    import deepspeed.ops
    from deepspeed.ops.op_builder import CPUAdamBuilder, FusedLambBuilder

    return {
        "compatible": deepspeed.ops.__compatible_ops__,
        "names": [CPUAdamBuilder.NAME, FusedLambBuilder.NAME],
        "load": _error(lambda: CPUAdamBuilder().load()),
        "load_missing": _error(lambda: FusedLambBuilder().load()),
    }


def wrapper_kinds():
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    kinds = (BF16_Optimizer, FP16_Optimizer, FP16_UnfusedOptimizer, DeepSpeedZeroOptimizer)

    def kind_of(stage, bf16, accum=None, client=False, opt_type="Adam"):
        model = torch.nn.Linear(4, 4)
        cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage}}
        if bf16:
            cfg["bf16"] = {"enabled": True}
        if accum:
            cfg["data_types"] = {"grad_accum_dtype": accum}
        optimizer = None
        if client:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        else:
            cfg["optimizer"] = {"type": opt_type, "params": {"lr": 1e-3}}
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=cfg)
        return [k.__name__ for k in kinds if isinstance(engine.optimizer, k)]

    return {
        "stage1_bf16_fp32_accum": kind_of(1, True, "fp32"),
        "stage1_bf16": kind_of(1, True),
        "stage0_bf16_client": kind_of(0, True, client=True),
        "stage0_bf16_adam": kind_of(0, True),
        "stage0_fp32": kind_of(0, False),
        "build": _error(lambda: BF16_Optimizer(None)),
        "not_an_optimizer": isinstance(object(), BF16_Optimizer),
    }


def zero_linear():
    from deepspeed.runtime.zero.linear import LinearModuleForZeroStage3

    torch.manual_seed(0)
    ours = LinearModuleForZeroStage3(5, 3)
    ref = torch.nn.Linear(5, 3)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 4, 5, requires_grad=True)
    y = ours(x)
    y.square().sum().backward()
    got = [y.detach(), x.grad.clone(), ours.weight.grad, ours.bias.grad]
    x.grad = None
    y = ref(x)
    y.square().sum().backward()
    want = [y.detach(), x.grad, ref.weight.grad, ref.bias.grad]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        in_autocast = ours(x).dtype
    from deepspeed.runtime.zero.linear import zero3_linear_wrap
    from torch.func import grad, vmap

    w = ours.weight.detach()
    batched = vmap(lambda row: zero3_linear_wrap(row, w))(torch.ones(6, 5))
    dw = grad(lambda w: zero3_linear_wrap(torch.ones(2, 5), w).sum())(w)
    return {
        "max_diff": max(float((a - b).abs().max()) for a, b in zip(got, want)),
        "autocast_dtype": str(in_autocast),
        "vmap_shape": list(batched.shape),
        "grad_is_twos": bool((dw == 2).all()),
    }


def unwrap():
    from deepspeed.runtime.zero import unwrap_model_for_generation

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    engine, *_ = deepspeed.initialize(model=model, config=cfg)
    x, y = torch.randn(2, 8), torch.tensor([0, 2])

    def train_step():
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        return loss.item()

    first = train_step()
    before = model[0].weight.numel()
    with unwrap_model_for_generation(engine) as unwrapped:
        inside = model[0].weight.numel()
        out = unwrapped(x)  # a forward with everything gathered
        still = model[0].weight.numel()
    after = model[0].weight.numel()
    return {
        "numel": [before, inside, still, after],
        "out_shape": list(out.shape),
        "trains_after": train_step() < first,
    }


def leaf_modules():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.leaf_module_config import (
        DEFAULT_LEAF_MODULE_CLASSES,
        DeepSpeedZeroLeafModuleConfig,
    )
    from deepspeed.utils import (
        get_z3_leaf_modules,
        set_z3_leaf_modules,
        set_z3_leaf_modules_by_name,
        set_z3_leaf_modules_by_suffix,
        unset_z3_leaf_modules,
        z3_leaf_module,
        z3_leaf_parameter,
    )

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.b(self.a(x))

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Block(), torch.nn.Linear(4, 2))
    marked = set_z3_leaf_modules(model, [Block])
    facts = {
        "marked": [m is model[1] for m in marked],
        "listed": len(get_z3_leaf_modules(model)),
        "flags": [z3_leaf_module(model), z3_leaf_module(model[1])],
        "unset": len(unset_z3_leaf_modules(model, ["Block"])),
        "after_unset": len(get_z3_leaf_modules(model)),
        "by_name": set_z3_leaf_modules_by_name(model, ["1", "9"], raise_if_not_found=False)[1],
        "by_suffix": len(set_z3_leaf_modules_by_suffix(model, ["1.a"])[0]),
        "none_found": _error(lambda: set_z3_leaf_modules(model, [torch.nn.Conv2d])),
        "section": DeepSpeedZeroConfig(leaf_module={"classes": "Block"}).leaf_module.classes,
        "section_default": DeepSpeedZeroConfig().leaf_module.classes == DEFAULT_LEAF_MODULE_CLASSES,
        "model_config": DeepSpeedZeroLeafModuleConfig(names="x", classes=["a", "a"]).model_dump(),
    }
    unset_z3_leaf_modules(model, [Block])
    set_z3_leaf_module_off = [m for m in model.modules() if z3_leaf_module(m)]
    for m in set_z3_leaf_module_off:
        m._z3_leaf = False
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": 3, "leaf_module": {"classes": ["Block"]}},
    }
    engine, *_ = deepspeed.initialize(model=model, config=cfg)
    loss = engine(torch.randn(2, 4)).sum()
    engine.backward(loss)
    engine.step()
    facts["leaf_params"] = [z3_leaf_parameter(p) for p in model.parameters()]
    return facts


def pinning_and_partitions():
    import os

    import deepspeed.utils.pin_memory as pin_memory
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.utils import partition_balanced, partition_uniform

    accel = get_accelerator()
    pinned = accel.pin_memory(torch.randn(4, 8))
    out = {
        "is_pinned": [
            accel.is_pinned(pinned) == pinned.is_pinned(),
            accel.is_pinned(torch.zeros(2, device="meta")),
        ],
        "unpin": accel.unpin_memory(pinned),
        "torch_backend": pin_memory.get_active_native_pinned_memory(),
    }
    os.environ["DS_PIN_MEMORY_BACKEND"] = "native"
    native = pin_memory.get_active_native_pinned_memory()
    locked = accel.pin_memory(torch.arange(6.0))
    out["native"] = [
        type(native).__name__,
        native is pin_memory.get_active_native_pinned_memory(),
        accel.is_pinned(locked[2:]),
        accel.unpin_memory(locked),
    ]
    del os.environ["DS_PIN_MEMORY_BACKEND"]
    cases = [([1, 2, 1], 4), ([1, 1, 1, 1, 1], 4), ([1, 1, 1, 1, 0, 1], 4), ([5, 1, 1, 9, 2], 2)]
    out["balanced"] = [partition_balanced(w, n) for w, n in cases]
    out["uniform"] = [partition_uniform(10, 3), partition_uniform(2, 3)]
    return out


def main():
    print(
        json.dumps(
            {
                "config_model": config_model(),
                "zero_config": zero_config(),
                "readers": readers(),
                "op_builders": op_builders(),
                "wrapper_kinds": wrapper_kinds(),
                "zero_linear": zero_linear(),
                "unwrap": unwrap(),
                "leaf_modules": leaf_modules(),
                "pinning_and_partitions": pinning_and_partitions(),
            }
        )
    )


if __name__ == "__main__":
    main()

"""Checks of the installed `deepspeed` package's API on one process (run by test_api.py in a
subprocess, so transformers and accelerate see the package). Prints one JSON object of plain
facts; the test compares them with what they must be."""

import copy
import importlib.metadata
import io
import json
import os

import deepspeed
import torch
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

BATCH = 4


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 8, generator=g), torch.randint(0, 3, (BATCH,), generator=g)


def config(stage, **zero):
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage, **zero},
    }


def reference_grad_norm():
    model = make_model()
    x, y = data()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))


def versions():
    from accelerate.utils import compare_versions
    from transformers.dependency_versions_check import dep_version_check
    from transformers.integrations.deepspeed import is_deepspeed_available

    import zerostream

    dep_version_check("deepspeed")  # raises when transformers rejects the version
    return {
        "metadata": importlib.metadata.version("deepspeed"),
        "module": deepspeed.__version__,
        "zerostream": zerostream.__version__,
        "transformers_sees_it": is_deepspeed_available(),
        "accelerate_minimum_ok": compare_versions("deepspeed", ">=", "0.9.3"),
    }


def engine_surface(stage):
    """What tools read from the engine and its optimizer wrapper, after one step."""
    model = make_model()
    engine, returned, _, _ = deepspeed.initialize(model=model, config=config(stage))
    # fp32 without ZeRO: initialize() returns the bare optimizer, as DeepSpeed does; the
    # engine keeps its wrapper, whose surface is read below at every stage.
    opt = engine.optimizer
    x, y = data()
    engine.set_gradient_accumulation_boundary(True)
    boundary = engine.is_gradient_accumulation_boundary()
    loss = torch.nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    engine.step()
    norm = engine.get_global_grad_norm()
    wanted = ["param_groups", "state", "dp_process_group", "_global_grad_norm", "state_dict"]
    wanted += ["load_state_dict", "zero_grad", "step", "backward"]
    wanted += {0: [], 1: ["bit16_groups"], 2: ["bit16_groups"], 3: ["fp16_groups"]}[stage]
    facts = {
        "returned_is_bare": returned is not opt and returned is opt.optimizer,
        "missing_optimizer_attributes": [a for a in wanted if not hasattr(opt, a)],
        "norm_attribute_is_engines": opt._global_grad_norm is norm,
        "state_dict_is_dict": isinstance(opt.state_dict(), dict),
        "engine_is_DeepSpeedEngine": isinstance(engine, deepspeed.DeepSpeedEngine),
        "engine_is_runtime_engine": isinstance(engine, deepspeed.runtime.engine.DeepSpeedEngine),
        "opt_is_stage_1_and_2": isinstance(opt, DeepSpeedZeroOptimizer),
        "opt_is_stage3": isinstance(opt, DeepSpeedZeroOptimizer_Stage3),
        "module_is_model": engine.module is model,
        "partition_weights": engine.zero_optimization_partition_weights(),
        "gather_16bit_on_save": engine.zero_gather_16bit_weights_on_model_save(),
        "boundary_after_set": boundary,
        "loss_scale": opt.loss_scale,
        "cur_scale": opt.cur_scale,
        "overflow": opt.overflow,
        "lr": opt.param_groups[0]["lr"],
        "grad_norm": float(norm),
        "grad_norm_is_tensor": torch.is_tensor(norm),
    }
    engine.destroy()
    return facts


def save_16bit():
    """save_16bit_model at stage 3: the whole weights when gathering on save is configured
    (equal to the model's own, gathered), nothing (False) when not."""
    import tempfile

    out = {}
    for gather in (True, False):
        model = make_model()
        start = {k: v.clone() for k, v in model.state_dict().items()}
        cfg = config(3, stage3_gather_16bit_weights_on_model_save=gather)
        engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
        with tempfile.TemporaryDirectory() as d:
            written = engine.save_16bit_model(d, "model.bin")
            files = os.listdir(d)
            same = None
            if written:
                saved = torch.load(os.path.join(d, "model.bin"))
                same = sorted(saved) == sorted(start) and all(
                    torch.equal(saved[k], v) for k, v in start.items()
                )
        out[str(gather)] = {"returned": written, "files": files, "equal_to_initial": same}
        engine.destroy()
    return out


def refusal(fn):
    try:
        fn()
    except NotImplementedError as exc:
        return f"NotImplementedError: {exc}"
    except Exception as exc:  # reported, and the test fails on the type
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def unsupported():
    out = {}
    for key, value in (
        ("zero_quantized_weights", True),
        ("zero_quantized_gradients", True),
        ("zero_hpz_partition_size", 2),
        ("mics_shard_size", 2),
        ("zenflow", {"topk_ratio": 0.1}),
        ("offload_optimizer", {"device": "cpu", "super_offload": True}),
    ):
        cfg = config(3, **{key: value})
        out[key] = refusal(lambda cfg=cfg: deepspeed.initialize(model=make_model(), config=cfg))
    cfg = {**config(2), "compile": {"deepcompile": True}}
    out["deepcompile"] = refusal(lambda: deepspeed.initialize(model=make_model(), config=cfg))

    def expert_groups():
        model = make_model()
        expert = model[2].weight
        expert.allreduce, expert.group_name = False, "ep_size_2"
        groups = deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer(
            {"params": list(model.parameters()), "name": "dense"}
        )
        out["moe_groups"] = [(g["name"], g.get("moe", False), len(g["params"])) for g in groups]
        deepspeed.initialize(model=model, model_parameters=groups, config=config(2))

    out["expert_params"] = refusal(expert_groups)
    out["moe_layer"] = refusal(
        lambda: deepspeed.moe.layer.MoE(
            hidden_size=8, expert=torch.nn.Linear(8, 8), num_experts=4, ep_size=2
        )
    )

    def compile_engine():
        engine, _, _, _ = deepspeed.initialize(model=make_model(), config=config(0))
        engine.compile(backend="inductor", compile_kwargs={})

    out["engine_compile"] = refusal(compile_engine)
    out["tp_model_init"] = refusal(lambda: deepspeed.tp_model_init(make_model(), 2, torch.float))
    plain = [{"params": list(make_model().parameters()), "name": "dense"}]
    out["split_without_experts"] = [
        (g["name"], len(g["params"]))
        for g in deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer(plain)
    ]
    return out


def fused_adam():
    """FusedAdam as the client optimizer at stage 2: the same losses as torch's AdamW."""
    losses = {}
    for name in ("fused", "torch"):
        model = make_model()
        if name == "fused":
            opt = deepspeed.ops.adam.FusedAdam(model.parameters(), lr=1e-2, weight_decay=0.1)
            cfg = config(2)
            del cfg["optimizer"]
            engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
            step = engine
        else:
            ref = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        x, y = data()
        run = []
        for _ in range(3):
            if name == "fused":
                loss = torch.nn.functional.cross_entropy(step(x), y)
                step.backward(loss)
                step.step()
            else:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                ref.step()
                ref.zero_grad()
            run.append(float(loss.detach()))
        losses[name] = run
    return losses


def helpers():
    from deepspeed.checkpoint.utils import clone_tensors_for_torch_save

    big = torch.arange(10000, dtype=torch.float32)
    view = big[:10]
    item = {"a": view, "b": [view, 3], "c": (view, "x")}
    cloned = clone_tensors_for_torch_save(item)

    def saved_bytes(obj):
        buf = io.BytesIO()
        torch.save(obj, buf)
        return len(buf.getvalue())

    cfg = deepspeed.runtime.config.DeepSpeedConfig(copy.deepcopy(config(2)))
    try:
        deepspeed.runtime.config.DeepSpeedConfig({"train_batch_size": "many"})
        bad = "no error"
    except ValueError as exc:
        bad = str(exc)
    # Accelerate's plugin sets steps_per_print = float("inf") ("never"), which JSON lacks.
    never = deepspeed.runtime.config.DeepSpeedConfig({**config(2), "steps_per_print": 1e999})
    return {
        "steps_per_print_inf": never.steps_per_print,
        "clone_equal": bool(torch.equal(cloned["a"], view) and cloned["b"][1] == 3),
        "clone_kinds": [type(cloned["b"]).__name__, type(cloned["c"]).__name__, cloned["c"][1]],
        "clone_bytes": saved_bytes(cloned),
        "view_bytes": saved_bytes(item),
        "config_isinstance": isinstance(cfg, deepspeed.runtime.config.DeepSpeedConfig),
        "config_stage": cfg.zero_stage,
        "config_bad": bad,
        "zero_is_runtime_zero": deepspeed.zero is deepspeed.runtime.zero,
        "zero_utils": zero_utils(),
    }


def zero_utils():
    """deepspeed.runtime.zero.utils: DeepSpeed's exception type catches zerostream's error."""
    from deepspeed.ops.adam import FusedAdam
    from deepspeed.runtime.zero import utils

    model = torch.nn.Linear(4, 4)
    cfg = {k: v for k, v in config(2, offload_optimizer={"device": "cpu"}).items()}
    del cfg["optimizer"]  # the client's optimizer instead
    try:  # a client optimizer with optimizer offload (zero_force_ds_cpu_optimizer)
        deepspeed.initialize(
            model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=cfg
        )
        caught = "no error"
    except utils.ZeRORuntimeException as exc:
        caught = str(exc)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    return {
        "caught": caught,
        "supported": [
            utils.is_zero_supported_optimizer(o)
            for o in (torch.optim.AdamW(model.parameters()), FusedAdam(model.parameters()), sgd)
        ],
        "zero_param": utils.is_zero_param(model.weight),
    }


def main():
    out = {"versions": versions(), "helpers": helpers()}
    out["reference_grad_norm"] = reference_grad_norm()
    out["stages"] = {stage: engine_surface(stage) for stage in range(4)}
    out["unsupported"] = unsupported()
    out["fused_adam"] = fused_adam()
    out["save_16bit"] = save_16bit()
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""The planner's memory terms against what small real engines allocate (issue 50), term by
term and to the byte: optimizer state (master, moments, the part on NVMe), gradient
partitions, the optimizer's and the parameters' NVMe staging, the copy stage's slots, stage
3's persistent params and its shards in host memory and on disk. Each engine is bench/gpt.py's
GPT (whose parameters the planner's GPT-2 shape lists exactly, in the partitioner's order) on
this CPU as one rank, over a grid of ZeRO options, precisions, gradient landings,
persistence thresholds and what max_in_cpu keeps in host memory. Both sides size through
sizing.py, so what this checks is that the planner asks it the runtime's questions (which
flags, which shards, which sub-groups), and it reads what the runtime made from the
runtime's own objects, not from sizing.py.

Only sizes the runtime fixes at setup are compared; it can resize a staging arena later (a
read-ahead larger than buffer_count buffers, a sub-group narrowed for low free memory), which
these small configurations never trigger."""

from typing import Dict, Optional

import pytest

SHAPE = {"layers": 1, "hidden": 32, "heads": 2, "vocab": 64, "seq": 16}
# Sub-groups narrower than the one param group's partition (15 328 elements), so that the
# optimizer's staging is sized from sub_group_size, not from the partition.
SUB_GROUP = 2048

PRECISIONS = {
    "fp32": {"enabled": False},
    "bf16": {"enabled": True},
    "bf16 masters": {"enabled": True, "bf16_master_weights_and_grads": True},  # 10 B
    "bf16 states": {  # 6 B
        "enabled": True,
        "bf16_master_weights_and_grads": True,
        "bf16_optimizer_states": True,
    },
}
# Where gradients land: each of the conditions that make an offloaded partition fp32
LANDINGS = {
    "auto": {},
    "offload fp32": {"zerostream": {"offload_gradient_dtype": "fp32"}},
    "accumulate fp32": {"data_types": {"grad_accum_dtype": "fp32"}},
    "2 micro-steps": {"gradient_accumulation_steps": 2},
}
# (stage3_param_persistence_threshold, stage3_model_persistence_threshold): the GPT's norms
# and biases are 32 and 96 elements, its up bias 128, its matrices 512 and more; a total of
# 200 stops persistence after the sixth small param.
PERSISTENCE = {"none": (0, None), "small": (100, None), "small, 200 in all": (100, 200)}

# What stays in host memory beside NVMe: zerostream.optimizer_max_in_cpu (whole 2048-element
# sub-groups: 2 of them, and not the 992-element last one, which would pass 5000) and
# offload_param.max_in_cpu (each shard in turn kept while the total allows: the 2048- and
# 512-element embeddings, then, past the matrices that do not fit, the 128-element up bias).
HELD = {"optimizer_max_in_cpu": 5000, "param_max_in_cpu": 2700}

# stage, offload_optimizer, offload_param, precision, landing, persistence[, held]
CASES = [
    (2, "none", "none", "fp32", "auto", "none"),
    (2, "none", "none", "bf16 states", "2 micro-steps", "none"),
    (2, "cpu", "none", "bf16", "auto", "none"),
    (2, "cpu", "none", "bf16 masters", "offload fp32", "none"),
    (2, "cpu", "none", "bf16", "accumulate fp32", "none"),
    (2, "nvme", "none", "bf16 masters", "auto", "none"),
    (2, "nvme", "none", "bf16 states", "2 micro-steps", "none"),
    (2, "nvme", "none", "fp32", "auto", "none"),
    (3, "none", "none", "bf16", "auto", "none"),
    (3, "none", "none", "fp32", "auto", "small, 200 in all"),
    (3, "cpu", "none", "bf16 masters", "auto", "small"),
    (3, "cpu", "none", "bf16", "offload fp32", "small, 200 in all"),
    (3, "cpu", "cpu", "bf16 states", "auto", "small"),
    (3, "cpu", "cpu", "bf16", "accumulate fp32", "none"),
    (3, "nvme", "none", "bf16", "2 micro-steps", "small"),
    (3, "nvme", "none", "bf16 masters", "offload fp32", "none"),
    (3, "nvme", "cpu", "fp32", "auto", "small, 200 in all"),
    (3, "cpu", "nvme", "bf16", "auto", "none"),
    (3, "nvme", "nvme", "bf16", "auto", "small"),
    (3, "nvme", "nvme", "bf16 masters", "accumulate fp32", "small, 200 in all"),
    (3, "nvme", "nvme", "bf16 states", "auto", "none"),
    (3, "nvme", "nvme", "bf16", "auto", "small", "held"),
    (3, "nvme", "none", "bf16 masters", "offload fp32", "none", "held"),
]


def _config(case, nvme: str) -> dict:
    stage, optimizer, param, precision, landing, persistence = case[:6]
    held = case[6:] == ("held",)
    zero: dict = {"stage": stage, "sub_group_size": SUB_GROUP}
    if stage == 3:
        threshold, total = PERSISTENCE[persistence]
        zero["stage3_param_persistence_threshold"] = threshold
        if total is not None:
            zero["stage3_model_persistence_threshold"] = total
    for key, device in (("offload_optimizer", optimizer), ("offload_param", param)):
        if device != "none":
            zero[key] = {"device": device, "pin_memory": False}
            if device == "nvme":
                zero[key]["nvme_path"] = nvme
    if param == "nvme":
        zero["offload_param"]["max_in_cpu"] = HELD["param_max_in_cpu"] if held else 0
    extension = {"optimizer_max_in_cpu": HELD["optimizer_max_in_cpu"]} if held else {}
    landed = LANDINGS[landing]
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "bf16": PRECISIONS[precision],
        "zero_optimization": zero,
        **landed,
        "zerostream": {**landed.get("zerostream", {}), **extension},
    }


def _predicted(config: dict, option) -> Dict[str, int]:
    """The planner's terms for this config, named as _allocated names the runtime's."""
    from zerostream.bench.validate import predict_cpu_run

    p = predict_cpu_run(SHAPE, config, option)
    both = {**p.device, **p.host}
    dname = "16-bit" if config["bf16"]["enabled"] else "fp32"
    return {
        "master": sum(v for k, v in both.items() if k in ("fp32 master", "bf16 master")),
        "moments": sum(v for k, v in both.items() if k in ("Adam m, v", "bf16 Adam m, v")),
        "state on nvme": sum(v for k, v in p.nvme.items() if "Adam m, v" in k),
        "state in host": sum(v for k, v in p.host.items() if k.endswith("(optimizer_max_in_cpu)")),
        "grads": sum(v for k, v in both.items() if k.endswith("grads")),
        "optimizer staging": p.host.get("optimizer staging", 0),
        "copy stage": p.host.get("copy stage staging", 0),
        "persistent params": p.device.get("persistent params", 0),
        "param shards in host": p.host.get(f"{dname} param shards", 0)
        + p.host.get(f"{dname} param shards (max_in_cpu)", 0),
        "param shards on nvme": p.nvme.get(f"{dname} param shards", 0),
        "param staging": p.host.get("param staging", 0),
    }


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _allocated(engine) -> Dict[str, int]:
    """What the engine made, read from its own objects after one optimizer step."""
    import torch

    opt = engine.optimizer
    swapper = opt.swapper  # offload_optimizer nvme
    moments = [
        t for st in opt.optimizer.state.values() for k, t in st.items() if k.startswith("exp_")
    ]
    zps = [p._zs for p in engine.module.parameters() if hasattr(p, "_zs")]
    params = zps[0].partitioner.swapper if zps else None  # offload_param nvme
    offloaded = engine._config.zero_optimization.offload_param_device != "none"

    def shard_bytes(zp) -> int:
        return zp.shard_numel * zp.dtype.itemsize

    return {
        "master": _bytes(opt.masters),
        "moments": _bytes(t for t in moments if torch.is_tensor(t)),
        "state on nvme": swapper.element_bytes * swapper.tiers.nvme_elements if swapper else 0,
        "state in host": swapper.element_bytes * swapper.tiers.host_elements if swapper else 0,
        "grads": _bytes(opt.grads),
        "optimizer staging": swapper.arena.stats()["budget"] if swapper else 0,
        # The copy stage keeps no size of its own beyond its arena's budget.
        "copy stage": opt.copy_stage._arena.stats()["budget"] if opt.copy_stage else 0,
        "persistent params": sum(zp.numel * zp.dtype.itemsize for zp in zps if zp.persist),
        "param shards in host": (
            sum(shard_bytes(zp) for zp in zps if not zp.persist and not zp.on_nvme)
            if offloaded
            else 0
        ),
        "param shards on nvme": sum(shard_bytes(zp) for zp in zps if zp.on_nvme),
        "param staging": params.stats()["staging_bytes"] if params else 0,
    }


def _mismatches(predicted: Dict[str, int], allocated: Dict[str, int]) -> Dict[str, tuple]:
    return {k: (predicted[k], allocated[k]) for k in allocated if predicted[k] != allocated[k]}


def _run(case, nvme: str) -> Optional[Dict[str, tuple]]:
    import torch

    import zerostream
    from zerostream.bench.gpt import GPT, GPTShape, batches
    from zerostream.estimate.plan import Option

    config = _config(case, nvme)
    shape = GPTShape(**SHAPE)
    torch.manual_seed(0)
    engine, *_ = zerostream.initialize(model=GPT(shape), config=config)
    try:
        data = batches(shape, 1, "cpu")
        for _ in range(engine.gradient_accumulation_steps()):
            loss = engine(*next(data))
            engine.backward(loss)
            engine.step()  # Adam makes its moments at the first step
        allocated = _allocated(engine)
    finally:
        engine.destroy()
    return _predicted(config, Option(*case[:3])), allocated


@pytest.fixture(scope="module")
def results(one_rank_process_group, tmp_path_factory):
    root = tmp_path_factory.mktemp("nvme")
    return {case: _run(case, str(root / str(i))) for i, case in enumerate(CASES)}


@pytest.mark.parametrize("case", CASES, ids=lambda c: "/".join(map(str, c)))
def test_the_planner_sizes_what_the_runtime_allocates(results, case):
    predicted, allocated = results[case]
    assert _mismatches(predicted, allocated) == {}, f"term: (planner, runtime) for {case}"


def test_the_grid_reaches_every_term_and_every_landing(results):
    """Each term is non-zero in some case, and each gradient dtype and state size occurs: a
    term both sides leave at 0 everywhere would compare nothing."""
    from zerostream.bench.gpt import GPTShape

    P = GPTShape(**SHAPE).params
    seen = {k for _, allocated in results.values() for k, v in allocated.items() if v}
    assert seen == set(next(iter(results.values()))[1]), seen
    offloaded_grads = {a["grads"] / P for c, (_, a) in results.items() if c[1] != "none"}
    assert offloaded_grads == {2, 4}, offloaded_grads
    states = ("master", "moments", "state on nvme", "state in host")
    per_element = {sum(a[k] for k in states) / P for _, a in results.values()}
    assert per_element == {6, 10, 12}, per_element


def test_a_wrong_byte_is_seen(results):
    """The comparison bites: one byte off in any term is a mismatch."""
    predicted, allocated = results[CASES[-2]]
    for term in allocated:
        off = dict(allocated, **{term: allocated[term] + 1})
        assert _mismatches(predicted, off) == {term: (predicted[term], off[term])}

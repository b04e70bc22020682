"""The planner on the issue's case (Llama 2 70B on one node of 8 x 40 GB GPUs, 1 TB RAM, 4 TB
NVMe) with every byte and second checked against arithmetic done here from bytes per
parameter, and the recipe in configs/ pinned to what the planner writes."""

import dataclasses
import json
import math
import pathlib

import pytest
from hf_configs import LLAMA2_70B

from zerostream import config, config_check
from zerostream.estimate import (
    Option,
    Workload,
    auto_knobs,
    best,
    build_machine,
    from_hf_config,
    predict,
)
from zerostream.estimate.plan import OPTIONS, Knobs, knobs_from_config

REPO = pathlib.Path(__file__).resolve().parents[3]
RECIPE = REPO / "configs" / "llama70b_8x40gb.json"
P = 68_976_648_192
PART = math.ceil(P / 8)


def _pages(nbytes: int) -> int:
    """A staging buffer of `nbytes` as a host arena takes it: whole 4 KiB pages."""
    return -(-nbytes // 4096) * 4096


def _node(**kw):
    args = dict(gpus_per_node=8, nodes=1, gpu_mem=40 * 10**9, cpu_mem=10**12, nvme=4 * 10**12)
    args.update(kw)
    return build_machine(**args, use_cache=False)


def _plan70b():
    shape = from_hf_config(LLAMA2_70B)
    work = Workload(micro_batch=1, seq=4096, grad_accum=1, precision="bf16", checkpointing=True)
    machine = _node()
    return shape, work, machine, [predict(shape, work, machine, Option(*o)) for o in OPTIONS]


def test_70b_needs_stage3_and_nvme_for_the_optimizer():
    _, _, _, preds = _plan70b()
    by = {(p.option.stage, p.option.optimizer, p.option.param): p for p in preds}
    for p in preds:
        if p.option.stage == 2:  # 2 B x 69 B params on every GPU
            assert not p.fits and "GPU" in p.problems[0] and "16-bit params 138 GB" in p.problems[0]
    assert not by[(3, "none", "none")].fits  # 16 B/param / 8 GPUs = 138 GB per GPU
    assert any("Adam m, v" in x for x in by[(3, "none", "none")].problems)
    # 12 B/param of state + 2 B/param of 16-bit gradients = 966 GB (+ the processes: 990 GB)
    # > the 950 GB of a 1 TB node a job may plan on.
    for param in ("none", "cpu"):
        p = by[(3, "cpu", param)]
        assert not p.fits and p.problems[0].startswith("host ")
    assert by[(3, "cpu", "none")].host["16-bit grads"] == 2 * PART
    assert "990 GB > 950 GB usable of 1000 GB" in by[(3, "cpu", "none")].problems[0]
    rec = best(preds)
    assert (rec.option.stage, rec.option.optimizer, rec.option.param) == (3, "nvme", "none")


def test_70b_recommended_bytes_and_seconds_by_hand():
    _, _, machine, preds = _plan70b()
    rec = best(preds)
    assert rec.device["16-bit param shard"] == 2 * PART
    assert rec.host["16-bit grads"] == 2 * PART  # bf16, no accumulation: landed as is
    # 2 sets of p, m, v sub-groups, each in whole 4 KiB arena pages
    assert rec.host["optimizer staging"] == 2 * 3 * _pages(4 * 10**8)
    assert rec.nvme_node == 8 * 12 * PART  # fp32 master + exp_avg + exp_avg_sq
    assert rec.host["copy stage staging"] == 4 * 16 * 2**20  # pinned slots for PCIe copies
    staging = 2 * 3 * _pages(4 * 10**8) + 4 * 16 * 2**20
    assert rec.host_node == 8 * (2 * PART + staging + machine.host_overhead)
    t = rec.traffic
    assert t["nvme_read"] == t["nvme_write"] == 8 * 12 * PART
    assert t["d2h"] == 2 * PART and t["h2d"] == 2 * PART
    s = rec.seconds
    assert s["nvme"] == pytest.approx(96 * PART / 6e9 + 96 * PART / 5e9)
    assert s["cpu_adam"] == pytest.approx(8 * PART / 5e9)
    assert s["pcie"] == pytest.approx(2 * PART / 25e9)
    assert s["compute"] == pytest.approx(8 * P * 4096 / 312e12)  # recompute with checkpointing
    # Collectives (links.py): every bf16 gradient reduce-scattered once (each tensor of this
    # model divides by 8 ranks: no padding); the params gathered for the forward and again
    # for the backward, less what the prefetch plan keeps gathered across the turn (at
    # most the one pass) and the persistent norms (re-gathered once after the step).
    assert t["reduce_scatter"] == 2 * P
    assert 2 * P < t["all_gather"] < 2 * 2 * P
    assert t["intra"] == pytest.approx(7 / 8 * (t["all_gather"] + t["reduce_scatter"]))
    calls = t["all_gather_calls"] + t["reduce_scatter_calls"]
    assert s["intra"] == pytest.approx(t["intra"] / 150e9 + calls * 7 * 3e-6)
    assert "net" not in s and t["net"] == 0  # one node
    assert rec.bound_by == "nvme" and rec.step_seconds == pytest.approx(303.5, abs=0.1)
    assert rec.device_peak + machine.gpu_reserve <= 40 * 10**9


def test_70b_stage3_gathered_params_come_from_the_prefetch_planner():
    shape, work, machine, _ = _plan70b()
    knobs = auto_knobs(shape, Option(3, "nvme", "none"))
    p = predict(shape, work, machine, Option(3, "nvme", "none"), knobs)
    gathered = p.backward["gathered params"] // 2
    largest_module = 32000 * 8192
    # The planner caps live params at max_live_parameters, but a module always gathers whole.
    assert largest_module <= gathered <= knobs.max_live_parameters + largest_module
    small = dataclasses.replace(
        knobs, max_live_parameters=0, prefetch_bucket_size=0, max_reuse_distance=0
    )
    lean = predict(shape, work, machine, Option(3, "nvme", "none"), small)
    assert lean.backward["gathered params"] == 2 * largest_module


def test_the_recipe_is_what_the_planner_writes(tmp_path, capsys):
    from zerostream.estimate import main

    cfg = tmp_path / "llama70b.json"
    cfg.write_text(json.dumps(LLAMA2_70B))
    out = tmp_path / "out.json"
    rc = main(
        [
            "--model-config", str(cfg), "--gpus", "8", "--gpu-mem", "40GB", "--nodes", "1",
            "--cpu-mem", "1TB", "--nvme", "4TB", "--micro-batch", "1", "--seq", "4096",
            "--no-cache", "--write-config", str(out), "--with-comment",
        ]
    )  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert out.read_text() == RECIPE.read_text()
    res = config_check.check(str(RECIPE), world_size=8)
    assert res["ok"], res["errors"]
    loaded = config.load(str(RECIPE), world_size=8, log=False)
    z = loaded.zero_optimization
    # The GPU tier and host RAM hold the optimizer state (test_memory_tiers_fill_the_gpu_...).
    assert (z.stage, z.offload_optimizer_device, z.offload_param_device) == (3, "cpu", "none")
    assert z.offload_optimizer.ratio == 0.913793 and z.sub_group_size == 10**8
    assert loaded.precision == "bf16" and loaded.train_batch_size == 8


def test_a_model_that_fits_gets_no_offload():
    shape = from_hf_config(
        {
            **LLAMA2_70B,
            "hidden_size": 2048,
            "num_hidden_layers": 16,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "intermediate_size": 5632,
        }
    )
    work = Workload(1, 2048, 1, "bf16", True)
    preds = [predict(shape, work, _node(gpu_mem=80 * 10**9), Option(*o)) for o in OPTIONS]
    rec = best(preds)
    assert (rec.option.stage, rec.option.optimizer) == (2, "none")
    assert rec.bound_by == "compute"


def test_config_knobs_are_used():
    shape = from_hf_config(LLAMA2_70B)
    cfg = config.load(
        {"train_micro_batch_size_per_gpu": 1,
         "zero_optimization": {"stage": 3, "reduce_bucket_size": 1000000,
                               "offload_optimizer": {"device": "nvme", "nvme_path": "/x",
                                                     "buffer_count": 6},
                               "sub_group_size": 2000000}},
        world_size=8, log=False,
    )  # fmt: skip
    knobs = knobs_from_config(cfg.zero_optimization)
    p = predict(
        shape, Workload(1, 4096, 1, "bf16", True), _node(), Option(3, "nvme", "none"), knobs
    )
    assert p.backward["reduce bucket"] == 2 * 2 * 10**6
    assert p.host["optimizer staging"] == 2 * 3 * _pages(4 * 2 * 10**6)  # max(2, 6 // 3) sets


def test_grad_accumulation_spreads_the_per_step_traffic():
    shape, _, machine, _ = _plan70b()
    o = Option(3, "nvme", "none")
    one = predict(shape, Workload(1, 4096, 1, "bf16", True), machine, o)
    many = predict(shape, Workload(1, 4096, 64, "bf16", True), machine, o)
    assert many.traffic["nvme_read"] == one.traffic["nvme_read"]
    assert many.traffic["d2h"] == 64 * one.traffic["d2h"]
    assert many.bound_by == "compute"


def _gpu_sub_groups(base, per: int = 12, grads: str = "host") -> int:
    """By hand: whole sub-groups of 1e8 elements (per bytes each: fp32 master and moments)
    in the GPU memory an all-on-NVMe option leaves, less 2 GB reserved, with their bf16
    gradients (2 bytes an element more) or, landed on the host, one sub-group's buffer."""
    spare = 40 * 10**9 - 2 * 10**9 - base.device_peak
    if grads == "device":
        return int(spare // ((per + 2) * 10**8))
    return int((spare - 2 * 10**8) // (per * 10**8))


def test_memory_tiers_fill_the_gpu_then_the_host_memory():
    """Issue 30's planner: the GPU memory an all-on-NVMe option leaves takes whole optimizer
    sub-groups first (offload_optimizer.ratio, Note [The device tier]); what it leaves of the
    node's usable RAM, per process, keeps param shards (6 bytes of disk traffic a step per 2
    held), then whole elements of optimizer state (24 per 12); the NVMe bytes and the step
    fall by as much. When the GPUs and the RAM hold all of the state, it is the "cpu" option
    with the ratio: no disk at all."""
    from zerostream.estimate.tiers import plan_tiers, predict_all
    from zerostream.offload.device_tier import device_count

    shape, work, machine, preds = _plan70b()
    by = {(p.option.stage, p.option.optimizer, p.option.param): p for p in preds}
    all_out = predict_all(shape, work, machine)
    planned = {p.option.param: p for p in all_out[len(OPTIONS) :]}
    assert set(planned) == {"none", "nvme"}
    # Params on the GPUs: 7 of 87 sub-groups there with their gradients landed in host RAM
    # (6 with them on the GPUs: the CPU Adam, the bound, would step 1e8 more elements a
    # rank), the rest fits in host RAM.
    t, base = planned["none"], by[(3, "nvme", "none")]
    n, k = math.ceil(PART / 10**8), _gpu_sub_groups(base)
    assert (n, k, _gpu_sub_groups(base, grads="device")) == (87, 7, 6)
    assert t.knobs.device_tier_grads == "host" and t.bound_by == "cpu_adam"
    assert t.step["device-tier gradient buffer"] == 2 * 10**8
    assert t.traffic["h2d"] == t.traffic["d2h"] == 2 * PART  # its grads up, not its weights
    assert t.option == Option(3, "cpu", "none", gpu_tier=True)
    assert t.option.label == "stage 3, optimizer gpu+cpu, params none"
    assert t.knobs.offload_ratio == pytest.approx(1 - 7.5 / 87)
    assert device_count(n, t.knobs.offload_ratio) == k
    assert t.device["device-tier fp32 master"] == 4 * k * 10**8
    assert t.device["device-tier Adam m, v"] == 8 * k * 10**8
    assert t.host["fp32 master"] == 4 * (PART - k * 10**8)
    assert t.host["Adam m, v"] == 8 * (PART - k * 10**8)
    assert t.nvme_node == 0 and t.traffic["nvme_read"] == 0
    assert t.traffic["cpu_adam"] == 8.0 * (PART - k * 10**8)
    assert t.host_node <= machine.host_usable and t.fits
    assert t.device_peak + machine.gpu_reserve <= machine.gpu_mem
    assert t.step_seconds < base.step_seconds
    # Params on NVMe: no GPU tier (the GPU holds no shard to free room for it); host tiers.
    t, base = planned["nvme"], by[(3, "nvme", "nvme")]
    free = (machine.host_usable - base.host_node) // 8  # per process, by hand
    shards = base.nvme.get("16-bit param shards", 0)
    keep = min(shards, free)
    opt = min(PART, (free - keep) // 12)
    assert t.option.tiered and not t.option.gpu_tier and t.knobs.offload_ratio == 1.0
    assert t.knobs.max_in_cpu == keep // 2 and t.knobs.optimizer_max_in_cpu == opt
    # The runtime keeps whole sub-groups in host memory: of 1e8 elements, and the last one
    # (PART % 1e8 = 22 M) when it fits beside them.
    held = opt // 10**8 * 10**8
    held += PART % 10**8 if held + PART % 10**8 <= opt else 0
    assert t.nvme["fp32 master, Adam m, v"] == 12 * (PART - held)
    assert t.traffic["optimizer_nvme_read"] == 8 * 12.0 * (PART - held)
    assert t.host_node <= machine.host_usable and t.fits
    assert t.step_seconds < base.step_seconds
    # Params on the GPUs and the optimizer on GPU + host: the recommendation.
    assert best(all_out) is planned["none"]
    # No spare GPU memory and a host that holds everything: the "cpu" option says it.
    roomy = _node(cpu_mem=10**13, gpu_mem=32 * 10**9)
    base = predict(shape, work, roomy, Option(3, "nvme", "none"))
    assert base.fits and plan_tiers(shape, work, roomy, base) is None


def test_device_landed_tier_gradients_take_no_host_memory():
    """With the device tier's gradients landing on the GPU (Note [Device-tier gradients stay
    on the device]) the host gradient partition holds only the offloaded share: 2 bytes an
    element less host memory for each element on the GPU; landed on the host, all of it."""
    shape, work, machine, preds = _plan70b()
    base = next(p for p in preds if p.option == Option(3, "nvme", "none"))
    option = Option(3, "cpu", "none", gpu_tier=True)
    got = {}
    for where in ("device", "host"):
        knobs = dataclasses.replace(
            base.knobs, sub_group_size=10**8, device_tier_grads=where, offload_ratio=1 - 6.5 / 87
        )
        got[where] = predict(shape, work, machine, option, knobs)
    k = 6 * 10**8  # int(6.5) whole sub-groups of 1e8 on each GPU
    assert got["device"].device["device-tier grads"] == 2 * k
    assert got["device"].host["16-bit grads"] == 2 * (PART - k)
    assert got["host"].host["16-bit grads"] == 2 * PART
    assert got["host"].host_node - got["device"].host_node == 8 * 2 * k


@pytest.mark.parametrize("states", [False, True])
def test_bf16_masters_and_moments_shrink_the_optimizer_state_by_hand(states):
    """bf16.bf16_master_weights_and_grads (2 B masters) and bf16_optimizer_states (2 + 2 B
    moments): 10 or 6 B/param of optimizer state instead of 12 on NVMe, in its traffic, and
    in what the tier plan keeps per free byte; bf16 gradients without offload."""
    from zerostream.estimate.tiers import plan_tiers

    shape, _, _, _ = _plan70b()
    machine = _node(cpu_mem=4 * 10**11)  # too little for all of it: the tier plan splits
    work = Workload(1, 4096, 1, "bf16", True, bf16_master=True, bf16_states=states)
    per = 6 if states else 10
    nv = predict(shape, work, machine, Option(3, "nvme", "none"))
    key = "bf16 master, bf16 Adam m, v" if states else "bf16 master, Adam m, v"
    assert nv.nvme == {key: per * PART}
    assert nv.traffic["optimizer_nvme_read"] == 8 * float(per * PART)
    assert nv.host["16-bit grads"] == 2 * PART
    widest = 2 if states else 4
    sets = max(2, nv.knobs.optimizer_buffer_count // 3)
    width = min(nv.knobs.sub_group_size or PART, PART)
    assert nv.host["optimizer staging"] == sets * 3 * _pages(widest * width)
    on_gpu = predict(shape, work, machine, Option(3, "none", "none"))
    assert on_gpu.device["bf16 master"] == 2 * PART and on_gpu.device["bf16 grads"] == 2 * PART
    t = plan_tiers(shape, work, machine, nv)
    where = t.knobs.device_tier_grads
    # the GPU tier holds per bytes an element too (and its 2-byte gradients, landed there)
    gpu = _gpu_sub_groups(nv, per, grads=where) * 10**8
    free = (machine.host_usable - nv.host_node) // 8
    if where == "device":  # the host gradient partition is 2 bytes an element shorter
        free += 2 * gpu
    assert 0 < free // per < PART
    assert t.knobs.optimizer_max_in_cpu == free // per
    assert gpu > 0 and t.device[f"device-tier {key.split(',')[0]}"] == 2 * gpu
    budget = t.knobs.optimizer_max_in_cpu  # whole sub-groups within it, the short one too
    held = budget // 10**8 * 10**8
    held += PART % 10**8 if held + PART % 10**8 <= budget else 0
    assert t.nvme[key] == per * (PART - gpu - held)


def test_collectives_cross_the_network_once_per_node_and_nvlink_on_the_other_hops():
    from zerostream.estimate.links import link_bytes, link_seconds

    gather = {"all_gather": {"bytes": 1000.0, "calls": 2}}
    # 2 nodes x 2 ranks: each rank sends 3/4 of the payload; of each node's two ring hops
    # one stays inside (half of it per GPU) and one leaves the node.
    assert link_bytes(gather, gpus=2, nodes=2) == {"intra": 375.0, "net": 750.0}
    assert link_bytes(gather, gpus=4, nodes=1) == {"intra": 750.0, "net": 0.0}
    assert link_bytes({"all_reduce": {"bytes": 1000.0, "calls": 1}}, 4, 1)["intra"] == 1500.0
    machine = _node(nodes=2)  # 16 ranks
    s = link_seconds({"all_gather": {"bytes": 16e9, "calls": 10}}, machine)
    assert s["intra"] == pytest.approx(15 / 16 * 16e9 * 7 / 8 / 150e9)
    assert s["net"] == pytest.approx(15 / 16 * 16e9 / 25e9 + 10 * 15 * 10e-6)


def test_70b_on_four_nodes_is_bound_by_the_network_between_them():
    shape, work, _, _ = _plan70b()
    machine = _node(nodes=4, gpu_mem=80 * 10**9)
    p = predict(shape, work, machine, Option(3, "cpu", "none"))
    t, s = p.traffic, p.seconds
    N = 32
    assert t["net"] == pytest.approx((N - 1) / N * (t["all_gather"] + t["reduce_scatter"]))
    assert t["intra"] == pytest.approx(7 / 8 * t["net"])
    assert s["net"] > s["intra"] and p.bound_by in ("net", "cpu_adam")


@pytest.mark.parametrize("offload", ["cpu", "nvme"])
def test_offload_ratio_moves_the_first_sub_groups_state_to_the_gpu_by_hand(offload):
    """offload_optimizer.ratio 0.3 (Note [The device tier]): of PART / 1e8 sub-groups the
    first int(0.7 n) keep master, moments and gradients on the GPU, off the host (or disk);
    neither their gradients nor their weights cross, and the CPU kernel skips them."""
    shape = from_hf_config(LLAMA2_70B)
    work = Workload(1, 4096, 1, "bf16", True)
    machine = _node()
    section = {"device": offload, "ratio": 0.3}
    if offload == "nvme":
        section["nvme_path"] = "/x"
    cfg = config.load(
        {"train_micro_batch_size_per_gpu": 1,
         "zero_optimization": {"stage": 3, "sub_group_size": 10**8,
                               "offload_optimizer": section}},
        world_size=8, log=False,
    )  # fmt: skip
    knobs = knobs_from_config(cfg.zero_optimization)
    assert knobs.offload_ratio == 0.3
    whole = dataclasses.replace(knobs, offload_ratio=1.0)
    option = Option(3, offload, "none")
    part, tier = (
        predict(shape, work, machine, option, knobs),
        predict(shape, work, machine, option, whole),
    )
    n = math.ceil(PART / 10**8)
    dev = int(0.7 * n) * 10**8  # 60 of the 87 sub-groups
    assert part.device["device-tier fp32 master"] == 4 * dev
    assert part.device["device-tier Adam m, v"] == 8 * dev
    assert part.device["device-tier grads"] == 2 * dev  # bf16, as the host partition
    where = part.host if offload == "cpu" else part.nvme
    before = tier.host if offload == "cpu" else tier.nvme
    # 12 bytes of state an element, and on "cpu" the host gradient partition's 2
    saved = 14 * dev if offload == "cpu" else 12 * dev
    assert sum(before.values()) - sum(where.values()) == saved
    assert part.host["16-bit grads"] == 2 * (PART - dev)
    # The device tier's bf16 gradients do not go down, nor its bf16 weights up.
    assert tier.traffic["h2d"] == tier.traffic["d2h"] == 2 * PART
    assert part.traffic["h2d"] == part.traffic["d2h"] == 2 * (PART - dev)
    assert part.traffic["cpu_adam"] == tier.traffic["cpu_adam"] - 8 * dev
    if offload == "nvme":
        assert part.traffic["optimizer_nvme_read"] == 8.0 * 12 * (PART - dev)


def test_an_element_count_on_the_device_plans_as_the_ratio_that_keeps_those_sub_groups():
    """zerostream.optimizer_max_on_device 6.05e9 elements: the first 60 whole sub-groups of
    1e8 (the 61st does not fit), the same device tier as ratio 0.3 keeps (int(0.7 x 87));
    "auto" is sized by the run and planned as none."""
    shape = from_hf_config(LLAMA2_70B)
    work = Workload(1, 4096, 1, "bf16", True)
    machine = _node()

    def load(section, ext):
        return config.load(
            {"train_micro_batch_size_per_gpu": 1,
             "zero_optimization": {"stage": 3, "sub_group_size": 10**8,
                                   "offload_optimizer": section},
             "zerostream": ext},
            world_size=8, log=False,
        )  # fmt: skip

    knobs = Knobs.from_config

    option = Option(3, "cpu", "none", gpu_tier=True)
    counted = knobs(load({"device": "cpu"}, {"optimizer_max_on_device": 6_050_000_000}))
    ratio = knobs(load({"device": "cpu", "ratio": 0.3}, {}))
    auto = knobs(load({"device": "cpu"}, {"optimizer_max_on_device": "auto"}))
    assert counted.optimizer_max_on_device == 6_050_000_000 and counted.offload_ratio == 1.0
    assert auto.optimizer_max_on_device == 0
    by_count = predict(shape, work, machine, option, counted)
    by_ratio = predict(shape, work, machine, option, ratio)
    assert by_count.device["device-tier fp32 master"] == 4 * 60 * 10**8
    assert by_count.device == by_ratio.device and by_count.host == by_ratio.host
    assert by_count.traffic == by_ratio.traffic
    none = predict(shape, work, machine, Option(3, "cpu", "none"), auto)
    assert "device-tier fp32 master" not in none.device


def test_an_element_count_on_the_device_at_stage_2_plans_its_sub_groups_there_too():
    """zerostream.optimizer_max_on_device at stage 2: the same whole sub-groups of the rank's
    partition on the device as at stage 3 (the partition is a slice of the flat groups
    there, the same size), the CPU kernel's traffic less theirs."""
    shape = from_hf_config(LLAMA2_70B)
    work = Workload(1, 4096, 1, "bf16", True)
    machine = _node()

    def knobs(ext):
        return Knobs.from_config(config.load(
            {"train_micro_batch_size_per_gpu": 1,
             "zero_optimization": {"stage": 2, "sub_group_size": 10**8,
                                   "offload_optimizer": {"device": "cpu"}},
             "zerostream": ext},
            world_size=8, log=False,
        ))  # fmt: skip

    counted = knobs({"optimizer_max_on_device": 6_050_000_000})
    assert counted.optimizer_max_on_device == 6_050_000_000
    with_tier = predict(shape, work, machine, Option(2, "cpu", "none", gpu_tier=True), counted)
    without = predict(shape, work, machine, Option(2, "cpu", "none"), knobs({}))
    assert with_tier.device["device-tier fp32 master"] == 4 * 60 * 10**8
    assert "device-tier fp32 master" not in without.device
    assert with_tier.traffic["cpu_adam"] < without.traffic["cpu_adam"]


def test_a_cpu_offload_with_spare_gpu_memory_steps_part_of_the_optimizer_there():
    """8 x 80 GB and 2 TB: the "cpu" option fits, bound by the CPU Adam (13.8 s); the GPU
    memory it leaves takes whole sub-groups of 1e8 elements (by hand), so the CPU kernel
    steps fewer and the step falls to near the GPUs' compute."""
    from zerostream.estimate.tiers import predict_all
    from zerostream.offload.device_tier import device_count

    shape, work, _, _ = _plan70b()
    machine = _node(cpu_mem=2 * 10**12, gpu_mem=80 * 10**9)
    out = predict_all(shape, work, machine)
    cpu = next(p for p in out if p.option == Option(3, "cpu", "none"))
    gpu = next(p for p in out if p.option == Option(3, "cpu", "none", gpu_tier=True))
    assert cpu.fits and cpu.bound_by == "cpu_adam"
    n = math.ceil(PART / 10**8)
    k = int((80 * 10**9 - 2 * 10**9 - cpu.device_peak - 2 * 10**8) // (12 * 10**8))
    assert 0 < k < n and device_count(n, gpu.knobs.offload_ratio) == k
    assert gpu.device["device-tier fp32 master"] == 4 * k * 10**8
    assert gpu.traffic["cpu_adam"] == 8.0 * (PART - k * 10**8)
    assert gpu.fits and gpu.step_seconds < cpu.step_seconds
    assert best(out) is gpu


def test_planning_every_option_imports_no_torch():
    """The planner sizes through sizing.py, not the runtime's modules: `zerostream estimate`
    answers without torch's import (seconds), offload options and the GPU tier included."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from zerostream.estimate import Workload, assumed_shape, build_machine\n"
        "from zerostream.estimate.tiers import predict_all\n"
        "m = build_machine(gpus_per_node=8, nodes=1, gpu_mem=80e9, cpu_mem=1e12, nvme=4e12,"
        " use_cache=False)\n"
        "preds = predict_all(assumed_shape(int(7e9)), Workload(1, 4096, 1, 'bf16', True), m)\n"
        "assert any(p.option.gpu_tier for p in preds), [p.option for p in preds]\n"
        "print(sorted(k for k in sys.modules if k.split('.')[0] == 'torch')[:3])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_the_step_started_during_the_backward_plans_its_copies_in_host_memory():
    """zerostream.overlap_step "backward": the copies of speculatively updated pieces take
    up to speculative_step_bytes of host memory a process (zero/speculate.py), never more
    than the master and moments they copy; other overlap modes take none."""
    shape = from_hf_config(LLAMA2_70B)
    work = Workload(1, 4096, 1, "bf16", True)
    machine = _node()

    def host(ext):
        knobs = Knobs.from_config(config.load(
            {"train_micro_batch_size_per_gpu": 1,
             "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
             "zerostream": ext},
            world_size=8, log=False,
        ))  # fmt: skip
        return predict(shape, work, machine, Option(3, "cpu", "none"), knobs).host

    serial = host({})
    behind = host({"overlap_step": "next_forward"})
    spec = host({"overlap_step": "backward", "speculative_step_bytes": 3 * 10**9})
    assert "speculation copies" not in serial and behind == serial
    assert spec["speculation copies"] == 3 * 10**9
    assert {k: v for k, v in spec.items() if k != "speculation copies"} == serial
    huge = host({"overlap_step": "backward", "speculative_step_bytes": 10**15})
    assert huge["speculation copies"] == serial["fp32 master"] + serial["Adam m, v"]

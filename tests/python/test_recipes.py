"""Every recipe in configs/ parses cleanly (DeepSpeed reads hjson, so their comments are fine)
and trains: three optimizer steps of a small GPT on 2 Gloo ranks, with the recipe as written
except nvme_path (moved under the test's directory). The NVMe recipes must leave their
state in real, allocated swap files."""

import math
import pathlib

import hjson
import pytest

from multirank import run_ranks
from zerostream import config

REPO = pathlib.Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "configs").glob("*.json"))


def _read(path: pathlib.Path) -> dict:
    return hjson.loads(path.read_text(), object_pairs_hook=dict)


def test_configs_dir_has_a_recipe_per_stage_offload_and_precision():
    names = {p.name for p in RECIPES}
    assert {
        "zero0_fp32.json",
        "zero1_bf16.json",
        "zero2_fp16.json",
        "zero2_offload_cpu.json",
        "zero2_offload_nvme.json",
        "zero3_bf16.json",
        "zero3_offload_cpu.json",
        "zero3_offload_nvme.json",
    } <= names


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_recipe_loads_cleanly_and_says_when_to_use_it(path):
    text = path.read_text()
    assert text.lstrip().startswith("//"), f"{path.name}: no leading comment saying when to use it"
    raw = _read(path)
    cfg = config.load(str(path), world_size=2, log=False)
    assert cfg.warnings == ()
    assert cfg.zero_stage == raw.get("zero_optimization", {}).get("stage", 0)
    offload = raw.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none")
    assert cfg.zero_optimization.offload_optimizer_device == offload


def _masters(engine):
    """This rank's fp32 master values: the sharded optimizers' partitions (read back from
    NVMe where they live there), or stage 0's whole parameters."""
    opt = engine.optimizer
    if hasattr(opt, "_fp32_partitions"):
        return [t.detach() for t in opt._fp32_partitions()]
    return [p.detach() for p in engine.module.parameters()]


def _one_step_per_recipe(rank, world, recipes, tmp):
    import torch

    import zerostream
    from zerostream.bench.gpt import GPT, GPTShape

    shape = GPTShape(layers=2, hidden=128, heads=4, vocab=256, seq=32)  # matrices > 1e4 elements
    results = {}
    for name, cfg in recipes:
        zero = cfg.setdefault("zero_optimization", {})
        for key in ("offload_optimizer", "offload_param"):
            if zero.get(key, {}).get("device") == "nvme":
                zero[key]["nvme_path"] = f"{tmp}/{name}"
        torch.manual_seed(0)
        with zerostream.zero.Init(config_dict_or_path=cfg, enabled=zero.get("stage") == 3):
            model = GPT(shape)
        engine, *_ = zerostream.initialize(model=model, config=cfg)
        before = [p.float().clone() for p in _masters(engine)]
        gen = torch.Generator().manual_seed(rank)
        losses = []
        # Three steps: WarmupLR (zero0_fp32) runs its first steps at warmup_min_lr = 0.
        for _ in range(3 * engine.gradient_accumulation_steps()):
            micro = engine.train_micro_batch_size_per_gpu()
            data = torch.randint(0, 256, (micro, 33), generator=gen)
            loss = engine(data[:, :-1], data[:, 1:])
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
        after = _masters(engine)
        moved = max(float((a.float() - b).abs().max()) for a, b in zip(after, before))
        disk = {}
        paths = {v["nvme_path"] for v in zero.values() if isinstance(v, dict) and "nvme_path" in v}
        for path in paths:
            mine = pathlib.Path(path) / "zerostream" / f"rank{rank}"  # other ranks' come and go
            files = [f for f in mine.rglob("*") if f.is_file()]
            disk[path] = sum(f.stat().st_blocks * 512 for f in files if "lock" not in f.name)
        swapper = getattr(engine.optimizer, "swapper", None)
        tiers = swapper.stats() if swapper is not None else None
        results[name] = {
            "tiers": tiers and {"host": tiers["host_elements"], "nvme": tiers["nvme_elements"]},
            "steps": engine.global_steps,
            "losses": losses,
            "moved": moved,
            "disk": disk,
        }
        engine.destroy()
        del engine, model
    return results


@pytest.mark.slow  # CI's 25 minutes; each recipe is validated in the default tier
@pytest.mark.timeout(300)
def test_every_recipe_trains_on_two_ranks(tmp_path):
    recipes = [(p.stem, _read(p)) for p in RECIPES]
    results = run_ranks(_one_step_per_recipe, 2, recipes, str(tmp_path), timeout=280)
    for name, raw in recipes:
        for rank in (0, 1):
            r = results[rank][name]
            assert r["steps"] == 3, (name, rank, r)
            assert all(math.isfinite(x) for x in r["losses"]), (name, r["losses"])
            assert r["moved"] > 0, f"{name}: the step changed no parameter"
            nvme = [
                k
                for k, v in raw.get("zero_optimization", {}).items()
                if isinstance(v, dict) and v.get("device") == "nvme"
            ]
            tiered = "optimizer_max_in_cpu" in raw.get("zerostream", {})
            if nvme == ["offload_optimizer"] and tiered:
                # Memory tiers: the first step streams the state from disk (the files hold
                # it), then "auto" moves what fits into host memory: for the tiny model, all.
                assert r["disk"] and all(b > 0 for b in r["disk"].values()), (name, r["disk"])
                assert r["tiers"]["host"] > 0 and r["tiers"]["nvme"] == 0, (name, r["tiers"])
            elif nvme:
                assert r["disk"] and all(b > 0 for b in r["disk"].values()), (name, r["disk"])

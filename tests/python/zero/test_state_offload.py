"""engine.offload_states / reload_states (zero/state_offload.py, Note [Parking state in host
memory]), DeepSpeed's API that RLHF frameworks call between training and generation.

On this CPU machine the states already live in host memory, where parking moves nothing; the
tests make it copy anyway (`_COPY_HOST_TENSORS`), which takes the path a GPU takes: every
tensor gets new storage, and the views carved out of moved buffers (stage 1/2 parameters,
stage 3 `ds_tensor` shards, persistent parameters' full copies) must be carved again, both
ways. On 2 ranks at stages 1-3: a run that parks everything between steps (and the gradient
partitions between a backward and its step) ends bitwise where an uninterrupted run ends; the
engine refuses to run while parked; what DeepSpeed refuses is refused by name, except
offload_param, which works (the shards stay where it keeps them)."""

import pytest
import torch

from equal import gathered_weights
from mlp import MLP
from multirank import run_ranks

STEPS = 4


def _batch(rank: int, i: int) -> torch.Tensor:
    return torch.randn(2, 8, generator=torch.Generator().manual_seed(100 * rank + i))


def _config(stage: int, **zero) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        # Stage 3: the biases (16 and 4 elements) persist, the weights are sharded.
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 20, **zero},
    }


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def worker(rank, world, stages):
    import zerostream
    from zerostream.zero import state_offload
    from zerostream.zero.state_offload import OFFLOADED, state_devices

    state_offload._COPY_HOST_TENSORS = True
    out = {}
    for stage in stages:
        result = {}
        for parked in (False, True):
            torch.manual_seed(0)
            engine, *_ = zerostream.initialize(model=MLP(), config=_config(stage))
            for i in range(STEPS):
                loss = engine(_batch(rank, i))
                engine.backward(loss)
                if parked and i == 1:
                    # Between backward and step: the gradient partitions alone.
                    engine.offload_states(include=["lp_grads"])
                    engine.reload_states()
                engine.step()
                if parked and i == 1:
                    groups = engine.optimizer.offloadable_states()
                    before = {k: [_storage(t) for t in g.tensors] for k, g in groups.items()}
                    values = {k: [t.clone() for t in g.tensors] for k, g in groups.items()}
                    engine.offload_states()
                    moved = {
                        k.value: [_storage(t) for t in g.tensors] != before[k]
                        for k, g in groups.items()
                        if g.tensors
                    }
                    try:
                        engine(_batch(rank, 99))
                        refused = ""
                    except RuntimeError as exc:
                        refused = str(exc)
                    engine.reload_states()
                    kept = all(
                        torch.equal(t, v)
                        for k, g in groups.items()
                        for t, v in zip(g.tensors, values[k])
                    )
                    result["moved"], result["refused"], result["kept"] = moved, refused, kept
                    result["devices"] = sorted(str(d) for d in state_devices(engine, "lp_params"))
            # The views point into the storage that holds the state now.
            opt = engine.optimizer
            if stage < 3:
                views_ok = all(
                    s.param.data_ptr() == f.buffer.data_ptr() + s.offset * f.buffer.element_size()
                    for f in opt.flat_groups
                    for s in f.slots
                )
            else:
                views_ok = all(
                    _storage(zp.shard) == _storage(flat)
                    for flat, zps in zip(opt.flat16, opt.groups)
                    for zp in zps
                )
            result[parked] = (gathered_weights(engine), views_ok)
            engine.destroy()
        result["offloaded_message"] = OFFLOADED
        out[stage] = result
    return out if rank == 0 else None


@pytest.mark.multirank
def test_parked_and_reloaded_states_train_on_bitwise():
    results = run_ranks(worker, 2, (1, 2, 3), timeout=300)[0]
    for stage, r in results.items():
        (plain, plain_views), (parked, parked_views) = r[False], r[True]
        for a, b in zip(plain, parked):
            assert torch.equal(a, b), f"stage {stage}: a parked run diverged"
        assert plain_views and parked_views, f"stage {stage}: a view was left on old storage"
        # Every kind with tensors really moved (new storage), and came back unchanged.
        want = {"optim_states", "hp_params", "lp_grads", "lp_params"}
        if stage == 1:
            want.add("contiguous_grad_buffer")
        assert set(r["moved"]) == want and all(r["moved"].values()), (stage, r["moved"])
        assert r["kept"] is True
        assert r["refused"] == f"forward: {r['offloaded_message']}"
        assert r["devices"] == ["cpu"]


def refusals(rank, world):
    import zerostream

    def attempt(config, **kwargs):
        torch.manual_seed(0)
        engine, *_ = zerostream.initialize(model=MLP(), config=config)
        try:
            engine.offload_states(**kwargs)
            engine.offload_states(**kwargs)  # twice without a reload
            return "accepted"
        except (RuntimeError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            engine.destroy()

    return {
        "stage0": attempt(_config(0)),
        "nvme": attempt(_config(2), device="nvme"),
        "unknown": attempt(_config(2), include=["moments"]),
        "twice": attempt(_config(2)),
    }


@pytest.mark.multirank
def test_what_deepspeed_refuses_is_refused_by_name():
    r = run_ranks(refusals, 1)[0]
    assert r["stage0"] == (
        "RuntimeError: offload_states: needs ZeRO stage 1, 2 or 3 (zero_optimization.stage is 0)"
    )
    assert r["nvme"].startswith("ValueError: offload_states: NVMe is not a target")
    assert r["unknown"].startswith("ValueError: offload_states: unknown state 'moments'")
    assert r["twice"] == (
        "RuntimeError: offload_states: the states are offloaded already; reload_states first"
    )


def offload_param_worker(rank, world, root):
    """Stage 3 with offload_param cpu and nvme (DeepSpeed refuses offload_states there): a
    run parked between steps ends bitwise where an uninterrupted one ends; the persistent
    params' full copies (on the device) move and come back; the shards stay where
    offload_param keeps them (their storage never changes)."""
    import zerostream
    from zerostream.zero import state_offload

    state_offload._COPY_HOST_TENSORS = True  # a CPU run: copy what a GPU would move
    out = {}
    for device in ("cpu", "nvme"):
        offload = {"device": device}
        if device == "nvme":
            offload.update(nvme_path=f"{root}/swap{rank}", max_in_cpu=0)
        result = {}
        for parked in (False, True):
            torch.manual_seed(0)
            cfg = _config(3, offload_param=offload)
            engine, *_ = zerostream.initialize(model=MLP(), config=cfg)
            for i in range(STEPS):
                engine.backward(engine(_batch(rank, i)))
                engine.step()
                if parked and i == 1:
                    opt = engine.optimizer
                    shards = [
                        _storage(zp.shard) for zps in opt.groups for zp in zps
                        if zp.shard is not None and not zp.persist
                    ]  # fmt: skip
                    full = [_storage(zp._full) for zp in opt.part.params.values() if zp.persist]
                    engine.offload_states()
                    moved_full = [
                        _storage(zp._full) for zp in opt.part.params.values() if zp.persist
                    ]
                    engine.reload_states()
                    after = [
                        _storage(zp.shard) for zps in opt.groups for zp in zps
                        if zp.shard is not None and not zp.persist
                    ]  # fmt: skip
                    result["full_moved"] = bool(full) and all(
                        a != b for a, b in zip(full, moved_full)
                    )
                    result["shards_kept"] = shards == after
                    result["shards"] = (
                        len(shards),
                        sum(zp.on_nvme for zps in opt.groups for zp in zps),
                    )
            result[parked] = gathered_weights(engine)
            engine.destroy()
        out[device] = result
    return out if rank == 0 else None


@pytest.mark.multirank
def test_offload_states_with_offloaded_params_trains_on_bitwise(tmp_path):
    results = run_ranks(offload_param_worker, 2, str(tmp_path), timeout=300)[0]
    for device, r in results.items():
        for a, b in zip(r[False], r[True]):
            assert torch.equal(a, b), f"offload_param {device}: a parked run diverged"
        assert r["full_moved"], device  # the persistent copies were parked
        assert r["shards_kept"], device  # the offloaded shards stayed where they live
        in_memory, on_nvme = r["shards"]
        # cpu: the weights' shards in host memory, untouched; nvme: on disk, never tensors here
        assert (in_memory > 0 and on_nvme == 0) if device == "cpu" else on_nvme > 0, r["shards"]

"""ZeRO-3 construction and inspection APIs on 2 Gloo ranks: zero.Init builds the weights a
plain construction from the same seed builds (module default inits and `apply`-based
re-initialisation alike) and leaves only shards, with DeepSpeed's `ds_*` attributes;
GatheredParameters' modification round trip; a zero.Init model trains forward and backward
without an engine; the trace is re-recorded when control flow changes; ranks that run
modules in different orders get a clear error; evaluation without grad leaves nothing
gathered; stage 3 runs inference without an optimizer."""

import logging
import math

import pytest
import torch
import torch.nn as nn

from multirank import run_ranks
from tiny_gpt import TinyGPT, make_batches


class Reinit(nn.Module):
    """Re-initialises its weights through nn.Module.apply after its children exist, as
    Hugging Face models of transformers 4 do in post_init."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 300)
        self.b = nn.Linear(300, 8)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            nn.init.uniform_(m.bias, -0.1, 0.1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _gathered(model):
    from zerostream.zero import GatheredParameters

    out = {}
    for name, p in model.named_parameters():
        with GatheredParameters(p):
            out[name] = p.detach().clone()
    return out


def init_worker(rank, world):
    import zerostream
    from zerostream.zero import GatheredParameters, ZeroParamStatus

    result = {}
    config = {
        "train_batch_size": 2,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    for cls in (TinyGPT, Reinit):
        torch.manual_seed(0)
        with zerostream.zero.Init(config_dict_or_path=config, dtype=torch.float32):
            model = cls()
        attrs = [
            (
                p.numel(),
                p.ds_tensor.numel() == math.ceil(p.ds_numel / world),
                tuple(p.ds_shape),
                p.ds_status is ZeroParamStatus.NOT_AVAILABLE,
                isinstance(p.ds_id, int),
            )
            for p in model.parameters()
        ]
        result[cls.__name__] = (_gathered(model), attrs)

    # GatheredParameters: modifier_rank=0's writes reach every rank's shard; writes
    # without a modifier are dropped.
    torch.manual_seed(0)
    with zerostream.zero.Init(config_dict_or_path=config, dtype=torch.float32):
        lin = nn.Linear(5, 3)
    with GatheredParameters(lin.weight, modifier_rank=0):
        lin.weight.data.fill_(float(rank + 1))
    with GatheredParameters(lin.weight):
        kept = lin.weight.detach().clone()
        lin.weight.data.fill_(-7.0)
    with GatheredParameters(lin.weight):
        after_unsynced = lin.weight.detach().clone()
        # No copy: .cpu() of a host tensor is the tensor (DeepSpeed's tests save this way).
        alias = lin.weight.detach().cpu()
    result["modified"] = (kept, after_unsynced, lin.weight.numel(), alias.clone())

    # No engine: forward and backward of a zero.Init model; gradients stay whole.
    torch.manual_seed(0)
    with zerostream.zero.Init(config_dict_or_path=config, dtype=torch.float32):
        gpt = TinyGPT()
    xs, ys = make_batches(1, 4)
    loss = gpt(xs[0], ys[0])
    loss.backward()
    result["no_engine"] = (
        float(loss),
        {n: p.grad.clone() for n, p in gpt.named_parameters()},
        all(p.numel() == 0 for p in gpt.parameters()),
    )
    return result if rank == 0 else None


@pytest.mark.multirank
def test_zero_init_gathered_parameters_and_a_plain_backward():
    result = run_ranks(init_worker, 2, timeout=300)[0]
    for cls in (TinyGPT, Reinit):
        torch.manual_seed(0)
        plain = cls()
        weights, attrs = result[cls.__name__]
        for name, p in plain.named_parameters():
            torch.testing.assert_close(weights[name], p.detach(), rtol=0, atol=0, msg=name)
        for (numel, shard_ok, shape, status_ok, id_ok), p in zip(attrs, plain.parameters()):
            assert numel == 0 and shard_ok and status_ok and id_ok
            assert shape == tuple(p.shape)
    kept, after_unsynced, numel_after, alias = result["modified"]
    assert torch.equal(kept, torch.full((3, 5), 1.0))  # rank 0's value, on every rank
    assert torch.equal(after_unsynced, kept)  # no modifier_rank: the -7 was dropped
    assert numel_after == 0
    # What the block took from the full tensor outlives the release (the param let go of
    # it rather than freeing it in place).
    assert torch.equal(alias, kept)
    loss, grads, released = result["no_engine"]
    torch.manual_seed(0)
    plain = TinyGPT()
    xs, ys = make_batches(1, 4)
    ref = plain(xs[0], ys[0])
    ref.backward()
    assert loss == pytest.approx(float(ref.detach()), rel=1e-6)
    for name, p in plain.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-6, msg=name)
    assert released


class Branchy(nn.Module):
    """Runs `extra` only when asked: control flow that changes between steps."""

    def __init__(self, swap_on_rank1: bool = False):
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 32)
        self.extra = nn.Linear(32, 32)
        self.swap_on_rank1 = swap_on_rank1

    def forward(self, x, use_extra: bool = False, rank: int = 0):
        first, second = (self.b, self.a) if self.swap_on_rank1 and rank == 1 else (self.a, self.b)
        x = second(torch.tanh(first(x)))
        if use_extra:
            x = self.extra(x)
        return x.pow(2).mean()


def _config(**zero):
    return {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_clipping": 0.0,  # the plain-SGD references do not clip (DeepSpeed's is 1.0)
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, **zero},
    }


def branch_worker(rank, world, pattern):
    import zerostream

    records = []

    class Catch(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("zerostream").addHandler(Catch())
    torch.manual_seed(0)
    model = Branchy()
    engine, optimizer, _, _ = zerostream.initialize(model=model, config=_config())
    gen = torch.Generator().manual_seed(rank)
    for use_extra in pattern:
        x = torch.randn(4, 32, generator=gen)
        loss = engine(x, use_extra=use_extra)
        engine.backward(loss)
        engine.step()
    engine.eval()
    with torch.no_grad():
        evaluation = float(engine(torch.ones(4, 32)))
    left = [p.numel() for p in engine.module.parameters()]
    trace = optimizer.state_summary()["trace"]
    weights = _gathered(engine.module)
    return evaluation, left, trace, records, weights


def branch_reference(pattern, world):
    torch.manual_seed(0)
    model = Branchy()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gens = [torch.Generator().manual_seed(r) for r in range(world)]
    for use_extra in pattern:
        opt.zero_grad()
        for g in gens:
            (model(torch.randn(4, 32, generator=g), use_extra=use_extra) / world).backward()
        opt.step()
    with torch.no_grad():
        return float(model(torch.ones(4, 32))), {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.multirank
def test_changed_control_flow_rerecords_the_trace_and_stays_exact():
    pattern = [False, False, True, True, False, False]
    results = run_ranks(branch_worker, 2, pattern, timeout=300)
    evaluation, ref_weights = branch_reference(pattern, 2)
    for ev, left, trace, records, weights in results:
        assert ev == pytest.approx(evaluation, rel=1e-5)
        assert left == [0] * len(left), "evaluation left params gathered"
        for name, ref in ref_weights.items():
            torch.testing.assert_close(weights[name], ref, rtol=1e-5, atol=1e-6, msg=name)
        # Step 3 needs a module its recording lacks: it leaves the trace, which is recorded
        # again at step 4. Steps 5 and 6 run fewer modules than that recording: they walk
        # past `extra`'s gather (Note [One gather sequence on every rank]) and keep it.
        assert trace["invalidations"] == 1, trace
        assert trace["trace_recordings"] == 2, trace  # steps 1 and 4
        assert trace["walked_for_others"] == 4, trace  # forward and backward, twice
        said = [r for r in records if "module trace is recorded again" in r]
        assert len(said) == 1, records  # one log line (later ones at debug level)


def disorder_worker(rank, world):
    import zerostream

    torch.manual_seed(0)
    model = Branchy(swap_on_rank1=True)
    engine, _, _, _ = zerostream.initialize(model=model, config=_config())
    for _ in range(3):
        loss = engine(torch.ones(4, 32), rank=rank)
        engine.backward(loss)
        engine.step()
    return _gathered(engine.module), engine.optimizer.state_summary()["trace"]


def disorder_reference(world):
    torch.manual_seed(0)
    model = Branchy(swap_on_rank1=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        for r in range(world):
            (model(torch.ones(4, 32), rank=r) / world).backward()
        opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.multirank
def test_ranks_running_modules_in_different_orders_train_like_plain_pytorch():
    """Rank 1 runs b before a: the gathers still come in one order on every rank (rounds,
    then a trace each rank walks from its own needs; run_ranks compares the collectives).
    Before, the ranks were told to run one module order (DeepSpeed hangs)."""
    results = run_ranks(disorder_worker, 2, timeout=120)
    ref = disorder_reference(2)
    for weights, _ in results:
        for name, want in ref.items():
            torch.testing.assert_close(weights[name], want, rtol=1e-5, atol=1e-6, msg=name)
    assert results[0][1]["rounds"] == results[1][1]["rounds"] > 0


def inference_worker(rank, world):
    import zerostream

    torch.manual_seed(0)
    model = TinyGPT()
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    engine, optimizer, _, _ = zerostream.initialize(model=model, config=config)
    xs, ys = make_batches(1, 2)
    with torch.no_grad():
        loss = float(engine(xs[0], ys[0]))
    return optimizer, loss, [p.numel() for p in engine.module.parameters()]


@pytest.mark.multirank
def test_stage3_inference_needs_no_optimizer():
    optimizer, loss, sizes = run_ranks(inference_worker, 2, timeout=120)[0]
    torch.manual_seed(0)
    plain = TinyGPT()
    xs, ys = make_batches(1, 2)
    with torch.no_grad():
        assert loss == pytest.approx(float(plain(xs[0], ys[0])), rel=1e-6)
    assert optimizer is None
    assert any(s == 0 for s in sizes)  # big params released after the forward


def save_worker(rank, world, out_dir):
    import zerostream

    results = {}
    for gather in (True, False):
        torch.manual_seed(0)
        model = TinyGPT()
        config = {
            "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
            "zero_optimization": {
                "stage": 3,
                "stage3_param_persistence_threshold": 0,
                "stage3_gather_16bit_weights_on_model_save": gather,
            },
        }
        engine, _, _, _ = zerostream.initialize(model=model, config=config)
        xs, ys = make_batches(1, 4)
        loss = engine(xs[0][rank * 2 : rank * 2 + 2], ys[0][rank * 2 : rank * 2 + 2])
        engine.backward(loss)
        engine.step()
        saved = engine.save_16bit_model(f"{out_dir}/{gather}")
        engine.empty_partition_cache()
        results[gather] = (saved, _gathered(engine.module))
        engine.destroy()
        results[f"{gather}-left"] = [p.numel() for p in engine.module.parameters()]
    return results


@pytest.mark.multirank
def test_save_16bit_model_gathers_at_stage3_only_when_asked(tmp_path):
    results = run_ranks(save_worker, 2, str(tmp_path), timeout=300)
    saved, weights = results[0][True]
    assert saved is True
    state = torch.load(tmp_path / "True" / "pytorch_model.bin", weights_only=True)
    assert "head.weight" in state and "tok.weight" in state  # tied: under both names
    for name, w in weights.items():
        assert torch.equal(state[name], w), name
    assert results[1][True][0] is True  # every rank returns True, rank 0 wrote
    assert results[0][False][0] is False and not (tmp_path / "False").exists()
    assert all(n == 0 for n in results[0]["True-left"])


def frozen_worker(rank, world):
    import zerostream

    torch.manual_seed(0)
    model = Branchy()
    model.a.requires_grad_(False)  # a frozen base layer, as in LoRA fine-tuning
    engine, optimizer, _, _ = zerostream.initialize(model=model, config=_config())
    gen = torch.Generator().manual_seed(rank)
    for _ in range(3):
        loss = engine(torch.randn(4, 32, generator=gen))
        engine.backward(loss)
        engine.step()
    left = [p.numel() for p in engine.module.parameters()]
    state = optimizer.state_summary()["fp32_master_numel"]
    return _gathered(engine.module), left, state


@pytest.mark.multirank
def test_frozen_params_are_partitioned_and_released_but_not_stepped():
    results = run_ranks(frozen_worker, 2, timeout=120)
    torch.manual_seed(0)
    model = Branchy()
    model.a.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    gens = [torch.Generator().manual_seed(r) for r in range(2)]
    for _ in range(3):
        opt.zero_grad()
        for g in gens:
            (model(torch.randn(4, 32, generator=g)) / 2).backward()
        opt.step()
    for weights, left, state in results:
        for name, p in model.named_parameters():
            torch.testing.assert_close(weights[name], p.detach(), rtol=1e-5, atol=1e-6)
        assert left == [0] * len(left)  # frozen params released after backward too
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert state == trainable // 2  # each rank: half of the trainable elements only


class HeadUsesChildWeight(nn.Module):
    """The output head reads the embedding's weight by attribute in the parent's forward
    (not registered as external): it must be fetched on access, as DeepSpeed does."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(64, 32)
        self.mix = nn.Linear(32, 32)

    def forward(self, idx):
        x = torch.tanh(self.mix(self.tok(idx)))
        logits = torch.nn.functional.linear(x, self.tok.weight)
        return logits.logsumexp(-1).mean()


def external_worker(rank, world):
    import zerostream

    torch.manual_seed(0)
    engine, optimizer, _, _ = zerostream.initialize(model=HeadUsesChildWeight(), config=_config())
    idx = torch.arange(8).view(2, 4) + rank
    losses = []
    for _ in range(3):
        loss = engine(idx)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    from zerostream.zero.stage3.module_state import external_params

    external = external_params(engine.module)
    return losses, _gathered(engine.module), len(external), optimizer.state_summary()["trace"]


@pytest.mark.multirank
def test_a_child_weight_read_in_the_parent_forward_is_fetched_and_registered():
    results = run_ranks(external_worker, 2, timeout=120)
    torch.manual_seed(0)
    model = HeadUsesChildWeight()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        for r in range(2):
            (model(torch.arange(8).view(2, 4) + r) / 2).backward()
        opt.step()
    for _, weights, external, trace in results:
        for name, p in model.named_parameters():
            torch.testing.assert_close(weights[name], p.detach(), rtol=1e-5, atol=1e-6)
        assert external == 1  # tok.weight became an external param of the root
        assert trace["invalidations"] <= 1, trace  # the first replay sees it once


def errors_worker(rank, world, tmp):
    import zerostream

    said = {}

    def attempt(name, fn):
        try:
            fn()
            said[name] = None
        except Exception as exc:  # the type and message are what is checked
            kind = "ValueError" if isinstance(exc, ValueError) else type(exc).__name__
            said[name] = f"{kind}: {exc}"  # config errors are ConfigError, a ValueError

    nvme_no_path = {
        "train_batch_size": 1,
        "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}},
    }

    def init_without_path():
        with zerostream.zero.Init(config_dict_or_path=nvme_no_path):
            nn.Linear(2, 2)

    attempt("nvme without nvme_path", init_without_path)
    attempt("bad dtype", lambda: zerostream.zero.Init(dtype=torch.int8))
    with zerostream.zero.Init(config_dict_or_path=_config(), dtype=torch.float32):
        model = Branchy()
    bf16 = dict(_config(), bf16={"enabled": True})
    attempt("dtype mismatch", lambda: zerostream.initialize(model=model, config=bf16))
    with zerostream.zero.GatheredParameters(model.a.weight, enabled=False):
        said["disabled gather numel"] = model.a.weight.numel()
    return said


@pytest.mark.multirank
def test_stage3_setup_errors_name_the_key_or_the_parameter(tmp_path):
    said = run_ranks(errors_worker, 1, str(tmp_path), timeout=120)[0]
    assert "ValueError" in said["nvme without nvme_path"]
    assert "zero_optimization.offload_param.nvme_path" in said["nvme without nvme_path"]
    assert "ValueError" in said["bad dtype"] and "torch.int8" in said["bad dtype"]
    assert "ValueError" in said["dtype mismatch"]
    assert "a.weight" in said["dtype mismatch"] and "bfloat16" in said["dtype mismatch"]
    assert said["disabled gather numel"] == 0  # enabled=False gathers nothing


def modify_worker(rank, world, nvme, offload):
    import zerostream
    from zerostream.zero import GatheredParameters

    torch.manual_seed(0)
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    if offload != "none":
        zero["offload_optimizer"] = {"device": offload, "nvme_path": nvme}
        zero["offload_param"] = {"device": offload, "nvme_path": nvme, "max_in_cpu": 0}
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}},
        "zero_optimization": zero,
    }
    model = Branchy()
    engine, _, _, _ = zerostream.initialize(model=model, config=config)
    with GatheredParameters(model.a.weight, modifier_rank=0):
        model.a.weight.data.fill_(0.25)
    loss = engine(torch.ones(1, 32))
    engine.backward(loss)
    engine.step()  # lr 0: the step writes the fp32 master back unchanged
    return _gathered(model)["a.weight"]


@pytest.mark.multirank
@pytest.mark.parametrize("offload", ["none", "nvme"])
def test_a_gathered_modification_survives_the_next_step(tmp_path, offload):
    weight = run_ranks(modify_worker, 2, str(tmp_path), offload, timeout=120)[0]
    assert torch.equal(weight, torch.full((32, 32), 0.25))


def cache_worker(rank, world):
    import zerostream
    from mlp import MLP

    torch.manual_seed(0)
    # Every param persistent: gathered once and kept, until empty_partition_cache.
    cfg = _config(stage3_param_persistence_threshold=10**6)
    engine, *_ = zerostream.initialize(model=MLP(), config=cfg)
    xs = [torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * rank + i)) for i in (0, 1)]
    engine.backward(engine(xs[0]))
    engine.step()
    kept = [p.numel() for p in engine.module.parameters()]
    engine.empty_partition_cache()
    emptied = [p.numel() for p in engine.module.parameters()]
    engine.backward(engine(xs[1]))  # gathers them again
    engine.step()
    with zerostream.zero.GatheredParameters(list(engine.module.parameters())):
        weights = [p.detach().clone() for p in engine.module.parameters()]
    return kept, emptied, weights


@pytest.mark.multirank
def test_empty_partition_cache_empties_persistent_params_and_training_goes_on():
    from mlp import MLP

    kept, emptied, weights = run_ranks(cache_worker, 2, timeout=120)[0]
    torch.manual_seed(0)
    plain = MLP()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for i in (0, 1):
        opt.zero_grad()
        for rank in (0, 1):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * rank + i))
            (plain(x) / 2).backward()
        opt.step()
    assert kept == [p.numel() for p in plain.parameters()]  # persistent: whole after a step
    assert emptied == [0] * len(kept)  # as DeepSpeed's empty_partition_cache leaves them
    for a, b in zip(weights, plain.parameters()):
        torch.testing.assert_close(a, b.detach(), rtol=1e-6, atol=1e-7)


def single_rank_group_worker(rank, world):
    import os

    import torch.distributed as dist

    from zerostream.zero import Init

    # torch.distributed made with a world of one (by hand or by a library) before the
    # launcher's world of two was seen: zero.Init would partition over one rank.
    dist.init_process_group("gloo", rank=0, world_size=1)
    os.environ["WORLD_SIZE"] = "2"
    said = {}
    try:
        with Init():
            nn.Linear(4, 4)
    except RuntimeError as e:
        said["implicit"] = str(e)
    with Init(data_parallel_group=dist.new_group([0])):  # a group of one, on purpose
        layer = nn.Linear(4, 4)
    said["explicit numel"] = layer.weight.ds_numel
    return said


def test_zero_init_refuses_a_world_of_one_when_the_launcher_started_more():
    """DeepSpeed #8084: a size-1 process group made before the launcher's world made every
    rank hold the whole model; zero.Init names the contradiction and the fix."""
    from zerostream.zero.stage3.init import contradicting_single_rank_group as check

    said = run_ranks(single_rank_group_worker, 1, timeout=120)[0]
    assert "WORLD_SIZE=2" in said["implicit"] and "init_distributed" in said["implicit"]
    assert said["explicit numel"] == 16
    assert check(1, None, {"WORLD_SIZE": "8"}) is not None
    for env in ({"WORLD_SIZE": "1"}, {}, {"WORLD_SIZE": "x"}, {"WORLD_SIZE": ""}):
        assert check(1, None, env) is None
    assert check(8, None, {"WORLD_SIZE": "8"}) is None
    assert check(1, object(), {"WORLD_SIZE": "8"}) is None


def sanity_worker(rank, world, checks):
    from zerostream.zero import GatheredParameters, Init

    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {
            "stage": 3,
            "enable_sanity_checks": checks,
            "stage3_param_persistence_threshold": 0,
        },
    }
    with Init(config_dict_or_path=config, dtype=torch.float32):
        lin = nn.Linear(6, 6)
    said = {}
    try:  # only rank 1 changes a param in place, without a modifier
        with GatheredParameters([lin.weight, lin.bias]):
            if rank == 1:
                with torch.no_grad():
                    lin.weight.add_(1.0)
    except RuntimeError as e:
        said["error"] = str(e)
    with GatheredParameters([lin.weight]):  # untouched: no error, and the change was dropped
        said["weight"] = lin.weight.detach().clone()
    said["numel after"] = lin.weight.numel()
    return said


@pytest.mark.multirank
@pytest.mark.parametrize("checks", [True, False])
def test_sanity_checks_refuse_an_unkept_in_place_change_on_every_rank(checks):
    """zero_optimization.enable_sanity_checks: a param changed in place inside
    GatheredParameters with modifier_rank=None (its change is dropped) raises on every rank,
    the one that changed it naming the param; without the key the change is dropped
    silently, as in DeepSpeed."""
    said = run_ranks(sanity_worker, 2, checks, timeout=120)
    for rank, s in enumerate(said):
        assert s["numel after"] == 0  # re-partitioned either way
        if checks:
            assert "in-place modification" in s["error"] and "modifier_rank" in s["error"]
            assert ("ds_id" in s["error"]) == (rank == 1)
        else:
            assert "error" not in s
    torch.testing.assert_close(said[0]["weight"], said[1]["weight"], rtol=0, atol=0)

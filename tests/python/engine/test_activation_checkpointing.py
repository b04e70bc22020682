"""deepspeed.checkpointing (zerostream/activation_checkpointing/): the checkpointed function
runs twice (forward, then recomputed in backward) and gives plain autograd's gradients; the
options from a ds_config or arguments do what they name (inputs to host memory, boundary
timing logs), and what zerostream cannot honour is refused by name."""

import logging

import pytest
import torch

from zerostream import activation_checkpointing as ac


@pytest.fixture(autouse=True)
def _fresh():
    ac.reset()
    yield
    ac.reset()


def _block():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def _grads(run):
    block = _block()
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1), requires_grad=True)
    calls = []

    def fn(inp):
        calls.append(torch.is_grad_enabled())
        return block(inp)

    out = run(fn, x)
    out.square().sum().backward()
    return [p.grad.clone() for p in block.parameters()] + [x.grad.clone()], calls


@pytest.mark.parametrize("entry", ["checkpoint", "non_reentrant_checkpoint"])
def test_checkpointed_block_runs_again_in_backward_with_plain_gradients(entry):
    want, plain_calls = _grads(lambda f, x: f(x))
    got, calls = _grads(getattr(ac, entry))
    assert len(plain_calls) == 1 and len(calls) == 2  # forward, then the recomputation
    if entry == "checkpoint":
        assert calls == [False, True]  # reentrant: forward without autograd, recompute with it
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_cpu_checkpointing_moves_the_saved_inputs_through_host_memory(monkeypatch):
    packed = []
    real = ac._offload_pack

    def counting(t):
        packed.append(tuple(t.shape))
        return real(t)

    monkeypatch.setattr(ac, "_offload_pack", counting)
    ac.configure(None, deepspeed_config={"activation_checkpointing": {"cpu_checkpointing": True}})
    assert ac.settings().cpu_checkpointing and ac.is_configured()
    want, _ = _grads(lambda f, x: f(x))
    got, _ = _grads(ac.checkpoint)
    # The one saved tensor of a reentrant checkpoint is its input, and it went through the hook.
    assert packed == [(4, 6)]
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    with pytest.raises(ac.CheckpointingConfigError, match="cpu_checkpointing"):
        _grads(ac.non_reentrant_checkpoint)


def test_arguments_override_the_config_and_a_path_is_read(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"activation_checkpointing": {"profile": true, "cpu_checkpointing": true}}')
    ac.configure(None, deepspeed_config=str(path), checkpoint_in_cpu=False, synchronize=True)
    s = ac.settings()
    assert s.profile and not s.cpu_checkpointing and s.synchronize_checkpoint_boundary


def test_profile_logs_the_forward_and_the_recomputation(caplog):
    ac.configure(None, profile=True)
    with caplog.at_level(logging.INFO, logger="zerostream"):
        _grads(ac.checkpoint)
    lines = [r.getMessage() for r in caplog.records if "activation checkpoint" in r.getMessage()]
    assert [line.split(":")[0] for line in lines] == [
        "activation checkpoint forward",
        "activation checkpoint recompute",
    ]


class _MPU:
    def __init__(self, size):
        self.size = size

    def get_model_parallel_world_size(self):
        return self.size


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(contiguous_checkpointing=True), "needs partition_activations"),
        (
            dict(contiguous_checkpointing=True, partition_activations=True),
            "contiguous_memory_optimization: contiguous activation buffers are not supported",
        ),
        (
            dict(deepspeed_config={"activation_checkpointing": {"bogus": 1}}),
            r"unknown keys \['bogus'\]",
        ),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(kwargs, match):
    with pytest.raises(ac.CheckpointingConfigError, match=match):
        ac.configure(None, **kwargs)
    assert not ac.is_configured()


def test_partitioned_activations_need_no_split_at_model_parallel_size_one():
    ac.configure(_MPU(1), partition_activations=True)
    assert ac.settings().partition_activations
    with pytest.raises(ac.CheckpointingConfigError, match="model-parallel size 2"):
        ac.configure(_MPU(2), partition_activations=True)


def _megatron_block():
    """A Megatron-style block: dropout in the "tensor-parallel" region draws from the
    tracker's model-parallel state, the residual dropout from the default generator."""
    torch.manual_seed(0)
    fc1, fc2 = torch.nn.Linear(6, 12), torch.nn.Linear(12, 6)

    def block(x):
        h = torch.nn.functional.gelu(fc1(x))
        with ac.get_cuda_rng_tracker().fork():
            h = torch.nn.functional.dropout(h, 0.5, training=True)
        return x + torch.nn.functional.dropout(fc2(h), 0.3, training=True)

    return block, [fc1.weight, fc1.bias, fc2.weight, fc2.bias]


@pytest.mark.parametrize("entry", ["checkpoint", "non_reentrant_checkpoint"])
def test_a_checkpointed_block_redraws_its_forked_dropout_as_in_the_forward(entry):
    """Megatron's pattern: model_parallel_cuda_manual_seed, dropout under the tracker's
    fork() inside a checkpointed block. The recomputation must draw the forward's masks from
    both states, so the gradients equal plain autograd's with the same seeds."""
    results = []
    for run in (lambda f, x: f(x), getattr(ac, entry)):
        ac.model_parallel_cuda_manual_seed(1234)
        block, params = _megatron_block()
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1), requires_grad=True)
        out = run(block, x)
        out.square().sum().backward()
        results.append([p.grad.clone() for p in params] + [x.grad.clone()])
        # A second forward draws new masks: the tracked state moved on in the first.
    for a, b in zip(*results):
        assert torch.equal(a, b)
    assert len(results[0]) == 5 and any(g.abs().sum() > 0 for g in results[0])


def test_model_parallel_seed_tracks_seed_plus_2718_and_seeds_the_default_state():
    ac.model_parallel_cuda_manual_seed(42)
    assert torch.initial_seed() == 42  # the default (data-parallel) state
    tracker = ac.get_cuda_rng_tracker()
    assert set(tracker.get_states()) == {"model-parallel-rng"}
    before = torch.get_rng_state()
    with tracker.fork():
        drawn = torch.rand(5)
    assert torch.equal(torch.get_rng_state(), before)  # the default state is untouched
    assert torch.equal(drawn, torch.rand(5, generator=torch.Generator().manual_seed(42 + 2718)))
    with tracker.fork():
        again = torch.rand(5)
    assert not torch.equal(again, drawn)  # the tracked state advanced
    with pytest.raises(KeyError, match="no state named 'other'"):
        with tracker.fork("other"):
            pass
    with pytest.raises(ValueError, match="seed 2760 is already tracked"):
        tracker.add("other", 42 + 2718)

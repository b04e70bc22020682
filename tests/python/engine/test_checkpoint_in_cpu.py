"""`activation_checkpointing.cpu_checkpointing` (DeepSpeed's checkpoint_in_cpu) on the device:
the inputs a checkpointed call saves are parked in page-locked host memory over the copy
stage and brought back, one ahead, for the recomputation (Note [Parked activations] in
zerostream/offload/saved_activations.py). Here on the simulated asynchronous device (a GPU
when the machine has one): a Megatron-style GPT written against `deepspeed.checkpointing`
trains through `initialize` as plain PyTorch does; the device holds L block inputs
fewer at the end of the forward; each wait of the parking is needed (deleting it poisons
the recomputation or is reported); a saved input changed in place is refused as autograd
refuses it."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import zerostream
from equal import same_tensors
from multirank import run_ranks

# deepspeed.checkpointing is this module (the compat package re-exports it); imported as
# zerostream's so the test runs where only zerostream is installed (scripts/gpu-check.sh).
from zerostream import activation_checkpointing as checkpointing

VOCAB, H, LAYERS, BATCH, SEQ, STEPS = 32, 16, 4, 4, 16, 3
ON_GPU = torch.cuda.is_available()


class Block(nn.Module):
    """A Megatron-style block: causal attention and MLP, dropout drawn from the tracker's
    model-parallel state (get_cuda_rng_tracker().fork()), as Megatron's layers do."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.qkv = nn.Linear(H, 3 * H, bias=False)
        self.proj = nn.Linear(H, H)
        self.fc, self.out = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).split(H, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        with checkpointing.get_cuda_rng_tracker().fork():
            x = x + F.dropout(self.proj(y), 0.1, self.training)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class MegatronGPT(nn.Module):
    def __init__(self, checkpointed: bool):
        super().__init__()
        self.checkpointed = checkpointed
        self.tok = nn.Embedding(VOCAB, H)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(H, VOCAB, bias=False)

    def forward(self, idx, targets):
        h = self.tok(idx)
        for block in self.blocks:
            h = checkpointing.checkpoint(block, h) if self.checkpointed else block(h)
        return F.cross_entropy(self.head(h).flatten(0, 1), targets.flatten())


def _batches():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(STEPS)]


CONFIG = {
    "train_micro_batch_size_per_gpu": BATCH,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
    "activation_checkpointing": {"partition_activations": True, "cpu_checkpointing": True},
}


def _train(engine_run: bool):
    """STEPS steps of MegatronGPT (the seeds as Megatron sets them): through initialize with the
    blocks checkpointed, or plain PyTorch (no checkpointing, torch.optim.AdamW)."""
    from zerostream.offload import saved_activations

    checkpointing.model_parallel_cuda_manual_seed(7)
    torch.manual_seed(0)
    model = MegatronGPT(checkpointed=engine_run)
    losses = []
    if engine_run:
        checkpointing.configure(None, deepspeed_config=CONFIG)
        engine, *_ = zerostream.initialize(model=model, config=CONFIG)
        device = engine.device
    else:
        device = torch.device("cuda") if ON_GPU else torch.device("cpu")
        model.to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    checkpointing.model_parallel_cuda_manual_seed(11)  # the dropout masks' seed
    for batch in _batches():
        x, y = batch[:, :-1].to(device), batch[:, 1:].to(device)
        if engine_run:
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
        else:
            loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        losses.append(float(loss))
    stats = saved_activations.parking_stats()
    if engine_run:
        engine.destroy()
        checkpointing.reset()  # drains and drops the parking, on this device
    return losses, stats


def engine_worker(rank, world):
    from zerostream.testing import sim_device

    plain, _ = _train(False)
    cpu, cpu_stats = _train(True)
    runs = {}
    if not ON_GPU:
        for policy, seed in (("lazy", 0), ("random", 5)):
            with sim_device.installed(policy=policy, seed=seed) as sim:
                try:
                    runs[policy] = (*_train(True), list(sim.violations))
                finally:
                    sim.violations.clear()
    return plain, cpu, cpu_stats, runs


@pytest.mark.device
@pytest.mark.timeout(300)
def test_a_megatron_style_gpt_with_cpu_checkpointing_trains_as_plain_pytorch():
    plain, cpu, cpu_stats, runs = run_ranks(engine_worker, 1)[0]
    # ZeRO-3 + CPU Adam against torch.optim.AdamW, without checkpointing: the same model math
    # in another summation order.
    assert cpu == pytest.approx(plain, rel=1e-5, abs=1e-6), (cpu, plain)
    act = BATCH * SEQ * H * 4  # one block's input, fp32
    if ON_GPU:  # the parking ran on the GPU itself
        assert (
            cpu_stats["parked"] == STEPS * LAYERS and cpu_stats["d2h_bytes"] == STEPS * LAYERS * act
        )
        return
    assert cpu_stats["parked"] == 0, "on the CPU the inputs already are in host memory"
    for policy, (losses, stats, violations) in runs.items():
        assert violations == [], (policy, violations)
        assert losses == cpu, (policy, losses, cpu)  # the device's timing changes nothing
        assert stats["parked"] == stats["fetched"] == STEPS * LAYERS, stats
        assert stats["fetched_ahead"] == STEPS * (LAYERS - 1), stats  # all but the first
        assert stats["d2h_bytes"] == stats["h2d_bytes"] == STEPS * LAYERS * act, stats


# --- on one device, in this process --------------------------------------------------------------


@pytest.fixture
def device():
    """(the device's memory counters, the sim or None), with checkpointing reset around."""
    from zerostream.testing import sim_device

    if ON_GPU:
        torch.cuda.set_device(0)
        yield None
        checkpointing.reset()
        return
    with sim_device.installed(policy="eager", track_memory=True) as sim:
        sim.set_device(0)
        try:
            yield sim
        finally:
            checkpointing.reset()


def _allocated(sim) -> int:
    return torch.cuda.memory_allocated() if sim is None else sim.memory.allocated_bytes()


def _peak(sim) -> int:
    return torch.cuda.max_memory_allocated() if sim is None else sim.memory.peak


def _reset_peak(sim) -> None:
    torch.cuda.reset_peak_memory_stats() if sim is None else sim.memory.reset_peak()


def _keep_up(sim, dev) -> None:
    """Every copy queued so far ran, as on a device whose lanes keep pace with compute (the
    sim's eager lanes run on threads of their own, which a busy machine can delay)."""
    if sim is not None:
        sim.synchronize_all()
        return
    torch.cuda.synchronize()  # the caching allocator takes back a block the lanes used when
    torch.empty(1, device=dev)  # it sees their events done, at its next malloc


def _step_memory(sim, cpu_checkpointing: bool):
    """One forward and backward of the GPT's blocks (checkpointed) on the device, its lanes
    caught up after each block: the bytes held at the end of the forward and the forward's
    peak, above what was held before, and the gradients."""

    checkpointing.configure(None, checkpoint_in_cpu=cpu_checkpointing)
    checkpointing.model_parallel_cuda_manual_seed(7)
    torch.manual_seed(0)
    dev = torch.device("cuda") if sim is None else sim.torch_device
    model = MegatronGPT(checkpointed=True).to(dev)
    batch = _batches()[0].to(dev)
    x, y = batch[:, :-1], batch[:, 1:]
    base = _allocated(sim)
    _reset_peak(sim)
    h = model.tok(x)
    for block in model.blocks:
        h = checkpointing.checkpoint(block, h)
        _keep_up(sim, dev)
    held, peak = _allocated(sim) - base, _peak(sim) - base
    F.cross_entropy(model.head(h).flatten(0, 1), y.flatten()).backward()
    return held, peak, [p.grad.clone() for p in model.parameters()]


@pytest.mark.device
def test_parked_inputs_leave_device_memory(device):
    """With the inputs parked, the device holds LAYERS block inputs fewer when the forward
    ends (each download ran, and nothing else kept them), and its peak is LAYERS - 1 inputs
    lower; the gradients are bit-equal."""
    held_off, peak_off, grads_off = _step_memory(device, False)
    held_on, peak_on, grads_on = _step_memory(device, True)
    act = BATCH * SEQ * H * 4
    assert held_off - held_on == LAYERS * act, (held_off, held_on, act)
    # The forward's peak is in its last block, where the other run also holds the earlier
    # blocks' inputs: all but the current one (which is the user's h in both).
    assert peak_off - peak_on == (LAYERS - 1) * act, (peak_off, peak_on, act)
    assert same_tensors(grads_on, grads_off)


def _grads_on_the_sim(mutate=None):
    """Gradients of the checkpointed GPT with cpu_checkpointing on the lazy device (no copy
    completes until something waits for it), after `mutate(parking)`; and what it reported."""
    from zerostream.offload import saved_activations
    from zerostream.testing import sim_device

    checkpointing.model_parallel_cuda_manual_seed(7)
    torch.manual_seed(0)
    model = MegatronGPT(checkpointed=True)
    batch = _batches()[0]
    with sim_device.installed(policy="lazy") as sim:
        sim.set_device(0)
        checkpointing.configure(None, checkpoint_in_cpu=True)
        if mutate is not None:
            mutate(saved_activations.parking_for(torch.device("cpu")))
        try:
            model(batch[:, :-1], batch[:, 1:]).backward()
            checkpointing.reset()
        finally:
            violations = list(sim.violations)
            sim.violations.clear()
    return [p.grad for p in model.parameters()], violations


def test_each_wait_of_the_parking_is_needed():
    """Deleting either wait breaks the run on the lazy device: without the compute stream's
    wait for its upload the recomputation reads the poison; without the host's wait for the
    download the upload sends the host buffer's poison."""
    want, violations = _grads_on_the_sim()
    assert violations == [] and all(bool(g.isfinite().all()) for g in want)

    def no_device_wait(parking):
        parking.stage.wait_mark = lambda mark: None

    def no_host_wait(parking):
        parking.stage.host_wait_mark = lambda mark: None

    for mutate in (no_device_wait, no_host_wait):
        got, _ = _grads_on_the_sim(mutate)
        assert not all(bool(g.isfinite().all()) for g in got), mutate.__name__


def test_an_input_changed_in_place_after_its_call_is_refused(device):
    """`h += checkpoint(f, h)` changes the saved input after the download was queued: refused
    at backward, naming it, as autograd refuses it without cpu_checkpointing."""

    torch.manual_seed(0)
    block = Block()
    dev = torch.device("cuda") if device is None else device.torch_device
    block.to(dev)
    checkpointing.model_parallel_cuda_manual_seed(7)
    for cpu in (False, True):
        checkpointing.configure(None, checkpoint_in_cpu=cpu)
        h = torch.randn(2, 4, H, device=dev).requires_grad_()
        h2 = h * 1.0
        h2 += checkpointing.checkpoint(block, h2)
        match = "in-place" if cpu else "inplace"
        with pytest.raises(RuntimeError, match=match):
            h2.sum().backward()


def test_an_input_changed_in_place_then_dropped_is_refused_too(device):
    """The saved input changed in place, then the next block runs, then the program drops
    it before backward: the change was seen at the next block's park and is refused at
    backward (before, the check needed the tensor alive at backward and let it pass)."""
    torch.manual_seed(0)
    block = Block()
    dev = torch.device("cuda") if device is None else device.torch_device
    block.to(dev)
    checkpointing.model_parallel_cuda_manual_seed(7)
    checkpointing.configure(None, checkpoint_in_cpu=True)
    h = torch.randn(2, 4, H, device=dev).requires_grad_()
    x = h * 1.0
    y = checkpointing.checkpoint(block, x)
    x.add_(1.0)  # the saved input of the first call, changed
    z = checkpointing.checkpoint(block, y * 1.0)
    del x  # and gone before backward
    with pytest.raises(RuntimeError, match="in-place"):
        z.sum().backward()


def test_a_retained_graph_fetches_its_inputs_again(device):
    """backward twice over one graph (retain_graph): the parked inputs come back both times;
    the gradients are twice those of one backward, bit for bit."""

    checkpointing.configure(None, checkpoint_in_cpu=True)
    checkpointing.model_parallel_cuda_manual_seed(7)
    torch.manual_seed(0)
    dev = torch.device("cuda") if device is None else device.torch_device
    model = MegatronGPT(checkpointed=True).to(dev).eval()  # no dropout: both runs alike
    batch = _batches()[0].to(dev)
    loss = model(batch[:, :-1], batch[:, 1:])
    loss.backward(retain_graph=True)
    once = [p.grad.clone() for p in model.parameters()]
    loss.backward()
    assert same_tensors([p.grad for p in model.parameters()], [2 * g for g in once])

"""Hidden states of gradient-checkpointed layers parked in host memory (DeepSpeed's
offload_activations.CheckpointHiddenStatesOffload; Note [Parked hidden states] in
zerostream/activation_checkpointing/hidden_states.py): which saved tensors are parked, the
marker on transformers' GradientCheckpointingLayer and its removal, and on the device (the
simulated asynchronous one, or a GPU) gradients bit-equal to a run without it while the
device holds the parked layers' inputs fewer."""

from functools import partial

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint
from transformers import GradientCheckpointingLayer

from equal import same_tensors
from zerostream.activation_checkpointing.hidden_states import (
    CheckpointHiddenStatesOffload,
    get_checkpoint_hidden_states_offloading_ctx_manager,
)

ON_GPU = torch.cuda.is_available()
H, LAYERS, ROWS = 32, 4, 16


class Layer(GradientCheckpointingLayer):
    """A decoder layer as Hugging Face writes them: hidden_states first."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(H, H)

    def forward(self, hidden_states):
        return hidden_states + torch.tanh(self.fc(hidden_states))


def layers(dev) -> nn.ModuleList:
    torch.manual_seed(0)
    stack = nn.ModuleList(Layer() for _ in range(LAYERS)).to(dev)
    for layer in stack:  # what model.gradient_checkpointing_enable() sets on each layer
        layer.gradient_checkpointing = True
        layer._gradient_checkpointing_func = partial(checkpoint, use_reentrant=False)
    return stack.train()


def test_only_marked_saves_on_the_device_are_parked_on_the_cpu_none_is():
    stack = layers("cpu")
    x = torch.randn(ROWS, H, requires_grad=True)
    off = CheckpointHiddenStatesOffload(min_offload_bytes=0, keep_last_count=0)
    with off:
        h = x
        for layer in stack:
            h = layer(h)
        h.square().sum().backward()
    # each layer marked its input, which its checkpoint saved: on the CPU it stays put
    s = off.stats
    assert (s.marked_tensors, s.skipped_marked_tensors, s.offloaded_tensors) == (LAYERS, LAYERS, 0)
    assert s.saved_tensors_seen >= LAYERS
    unmarked = CheckpointHiddenStatesOffload(min_offload_bytes=0)
    with unmarked:
        nn.Linear(H, H)(x).sum().backward()
    assert unmarked.stats.saved_tensors_seen > 0 and unmarked.stats.marked_tensors == 0
    with pytest.raises(ValueError, match="keep_last_count must be >= 0"):
        CheckpointHiddenStatesOffload(keep_last_count=-1)
    with pytest.raises(NotImplementedError, match="use_pin_memory=False"):
        CheckpointHiddenStatesOffload(use_pin_memory=False)


def test_the_marker_is_installed_while_a_context_is_open_and_removed_after():
    plain = GradientCheckpointingLayer.__call__
    outer, inner = CheckpointHiddenStatesOffload(), CheckpointHiddenStatesOffload()
    with outer:
        patched = GradientCheckpointingLayer.__call__
        assert patched is not plain
        with inner:
            assert GradientCheckpointingLayer.__call__ is patched
            with pytest.raises(RuntimeError, match="not re-entrant"):
                inner.__enter__()
        assert GradientCheckpointingLayer.__call__ is patched  # the outer one still open
    assert GradientCheckpointingLayer.__call__ is plain
    with pytest.raises(ValueError, match="boom"):
        with outer:
            raise ValueError("boom")
    assert GradientCheckpointingLayer.__call__ is plain
    # Outside a context, or in eval, or without checkpointing, nothing is marked.
    stack = layers("cpu")
    with outer:
        stack.eval()
        stack[0](torch.randn(2, H, requires_grad=True))
        stack.train()
        stack[0].gradient_checkpointing = False
        stack[0](torch.randn(2, H, requires_grad=True))
    assert outer.stats.marked_tensors == 0
    stack[1](torch.randn(2, H, requires_grad=True))
    assert outer.stats.marked_tensors == 0


@pytest.fixture
def device():
    """(the simulated device with its memory counted, or None on a GPU)."""
    from zerostream.offload import saved_activations
    from zerostream.testing import sim_device

    if ON_GPU:
        torch.cuda.set_device(0)
        yield None
    else:
        with sim_device.installed(policy="lazy", track_memory=True) as sim:
            sim.set_device(0)
            yield sim
    saved_activations.forget_parkings()


def _run(sim, keep_last, offload: bool):
    """A forward and backward through the checkpointed layers: gradients, the device bytes
    held when the forward ended above what was held before, and the context's statistics."""
    dev = torch.device("cuda") if sim is None else sim.torch_device
    stack = layers(dev)
    torch.manual_seed(1)
    x = torch.randn(ROWS, H, device=dev, requires_grad=True)

    def held():
        if sim is None:
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated()
        sim.synchronize_all()
        return sim.memory.allocated_bytes()

    off = get_checkpoint_hidden_states_offloading_ctx_manager(
        min_offload_bytes=0, keep_last_count=keep_last
    )
    with off if offload else torch.enable_grad():
        before = held()
        h = x * 1.0  # each layer's input is an activation, as in a model
        for layer in stack:
            h = layer(h)
        loss = h.square().sum()
        del h
        at_end = held() - before
        loss.backward()
    return [x.grad] + [p.grad for p in stack.parameters()], at_end, off.stats


@pytest.mark.device
@pytest.mark.parametrize("keep_last", [0, 1, 2])
def test_parked_hidden_states_give_the_same_gradients_and_leave_the_device(device, keep_last):
    want, held_plain, _ = _run(device, keep_last, offload=False)
    got, held_parked, stats = _run(device, keep_last, offload=True)
    assert same_tensors(got, want)
    parked = LAYERS - keep_last
    assert (stats.marked_tensors, stats.offloaded_tensors) == (LAYERS, parked)
    assert (stats.restored_tensors, stats.kept_last_tensors) == (parked, keep_last)
    # the device holds one layer input fewer for each parked one when the forward ends
    act = ROWS * H * 4
    assert held_plain - held_parked == parked * act, (held_plain, held_parked, act)


@pytest.mark.device
def test_the_parking_waits_are_what_makes_it_right(device):
    """On the lazy device no copy completes before something waits for it: without the
    compute stream's wait for an upload, backward reads the upload's poison."""
    from zerostream.offload import saved_activations

    if device is None:
        pytest.skip("a mutation check for the simulated device")
    want, _, _ = _run(device, 0, offload=False)
    # the sim's tensors say plain "cpu": their parking is that device's
    parking = saved_activations.parking_for(torch.device("cpu"))
    parking.stage.wait_mark = lambda mark: None
    try:
        got, _, _ = _run(device, 0, offload=True)
    finally:
        device.violations.clear()
    assert not same_tensors(got, want)


@pytest.mark.device
@pytest.mark.parametrize("keep_last", [0, 1])
def test_a_hidden_state_changed_in_place_after_its_save_is_refused(device, keep_last):
    """As autograd refuses it without the context: parked (keep_last 0, the parking's check
    at backward), changed while still kept and then parked by the next layer (refused at
    that park), or changed while kept to the end (refused at its fetch)."""
    dev = torch.device("cuda") if device is None else device.torch_device
    stack = layers(dev)
    x = torch.randn(ROWS, H, device=dev, requires_grad=True)
    off = CheckpointHiddenStatesOffload(min_offload_bytes=0, keep_last_count=keep_last)
    with off, pytest.raises(RuntimeError, match="in-place"):
        a = x * 1.0
        h = stack[0](a)
        with torch.no_grad():
            a.add_(1.0)  # the first layer's saved input, changed
        h = stack[1](h)  # with keep_last 1 this parks `a`: refused here
        h.sum().backward()
    with off, pytest.raises(RuntimeError, match="in-place"):
        a = x * 1.0
        h = stack[0](a)
        with torch.no_grad():
            a.mul_(2.0)
        h.sum().backward()  # with keep_last 1, `a` is still kept: refused at its fetch

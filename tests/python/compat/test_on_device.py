"""OnDevice (DeepSpeed's `deepspeed.OnDevice`, zerostream/on_device.py): modules built inside
have their parameters on the given device in the given dtype, meta ones allocate nothing
and materialize later, torch is left as it was on exit (errors included), and explicit
dtypes, data tensors and disabled contexts are left alone."""

import pytest
import torch

from zerostream import OnDevice


class Legacy(torch.nn.Module):
    """Older model code: the legacy constructor and a buffer asked for in fp32."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.Tensor(4, 3))
        self.register_buffer("stats", torch.zeros(3, dtype=torch.float32))
        self.register_buffer("positions", torch.arange(6))


def _placements(module):
    return {n: (t.device.type, t.dtype) for n, t in module.state_dict().items()}


def test_meta_bf16_builds_shapes_without_memory_then_materializes():
    with OnDevice(dtype=torch.bfloat16, device="meta"):
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16))
    assert _placements(model) == {
        "0.weight": ("meta", torch.bfloat16),
        "0.bias": ("meta", torch.bfloat16),
        "1.weight": ("meta", torch.bfloat16),
        "1.bias": ("meta", torch.bfloat16),
    }
    assert model[0].weight.shape == (16, 8)
    model.to_empty(device="cpu")
    assert model[0].weight.device.type == "cpu" and model[0].weight.dtype == torch.bfloat16
    out = model(torch.ones(2, 8, dtype=torch.bfloat16))
    assert out.shape == (2, 16)


def test_legacy_constructor_is_placed_and_explicit_dtypes_kept():
    with OnDevice(dtype=torch.float16, device="meta"):
        model = Legacy()
        data = torch.Tensor([1.5, 2.0])  # data, not sizes: left to torch
        empty = torch.Tensor()
        scalar = torch.tensor(0.5)
    assert _placements(model) == {
        "weight": ("meta", torch.float16),
        "stats": ("meta", torch.float32),  # the code asked for fp32
        "positions": ("meta", torch.int64),  # integers stay integers
    }
    assert model.weight.shape == (4, 3)
    assert data.device.type == "cpu" and data.dtype == torch.float32
    assert empty.device.type == "meta" and empty.shape == (0,)
    assert scalar.device.type == "meta" and scalar.dtype == torch.float16


def test_dtype_none_keeps_torch_dtypes_and_a_device_argument_wins():
    with OnDevice(device="meta"):
        lin = torch.nn.Linear(2, 2)
        here = torch.zeros(2, device="cpu")
    assert lin.weight.device.type == "meta" and lin.weight.dtype == torch.float32
    assert here.device.type == "cpu"


def test_torch_is_restored_after_the_context_and_after_an_error():
    before = torch.Tensor.__dict__.get("__new__")
    with pytest.raises(RuntimeError, match="inside"):
        with OnDevice(dtype=torch.bfloat16, device="meta"):
            raise RuntimeError("inside")
    assert torch.Tensor.__dict__.get("__new__") is before
    assert torch.zeros(2).device.type == "cpu" and torch.zeros(2).dtype == torch.float32
    assert torch.Tensor(2, 2).device.type == "cpu"


def test_nested_contexts_unwind_in_order():
    with OnDevice(dtype=torch.float16, device="meta"):
        with OnDevice(dtype=torch.bfloat16, device="cpu"):
            inner = torch.nn.Linear(2, 2)
        outer = torch.nn.Linear(2, 2)
    assert (inner.weight.device.type, inner.weight.dtype) == ("cpu", torch.bfloat16)
    assert (outer.weight.device.type, outer.weight.dtype) == ("meta", torch.float16)
    assert torch.Tensor(1).device.type == "cpu"


def test_disabled_is_a_no_op_and_bad_dtypes_are_refused():
    with OnDevice(dtype=torch.float16, device="meta", enabled=False):
        lin = torch.nn.Linear(2, 2)
    assert (lin.weight.device.type, lin.weight.dtype) == ("cpu", torch.float32)
    with pytest.raises(ValueError, match="floating-point"):
        OnDevice(dtype=torch.int8)

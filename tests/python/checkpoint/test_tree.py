"""checkpoint/tree.py's map_leaves, the one walk the checkpoint writers share: containers
rebuilt with their own types (named tuples too, which the torch.save path once lost), a
torch.Size kept whole, leaves other than tensors when asked."""

import collections

import torch

from zerostream.checkpoint import save, stream
from zerostream.checkpoint.tree import map_leaves

Pair = collections.namedtuple("Pair", "a b")


def test_every_tensor_is_mapped_and_every_container_keeps_its_type():
    state = collections.OrderedDict(
        s=[torch.ones(2), (torch.zeros(1), Pair(torch.ones(1), 3))], shape=torch.Size([2, 3])
    )
    out = map_leaves(state, lambda t: t + 1)
    assert type(out) is collections.OrderedDict and list(out) == ["s", "shape"]
    assert torch.equal(out["s"][0], torch.full((2,), 2.0))
    pair = out["s"][1][1]
    assert type(pair) is Pair and torch.equal(pair.a, torch.full((1,), 2.0)) and pair.b == 3
    assert out["shape"] == torch.Size([2, 3]) and type(out["shape"]) is torch.Size
    marked = map_leaves([1, "x", (2,)], str, lambda v: isinstance(v, int))
    assert marked == ["1", "x", ("2",)]


def test_the_torch_save_path_copies_views_out_inside_named_tuples(monkeypatch):
    monkeypatch.setattr(stream, "AVAILABLE", False)
    base = torch.arange(8.0)
    out = save._cpu({"p": Pair(base[2:4], base)})
    view, whole = out["p"]
    assert type(out["p"]) is Pair and torch.equal(view, base[2:4])
    # The view was copied out (torch.save writes a tensor's whole storage); the whole one not.
    assert view.untyped_storage().nbytes() == 2 * 4
    assert whole.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()

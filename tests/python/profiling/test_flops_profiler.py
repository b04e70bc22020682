"""The flops profiler (zerostream/profiling/) against counts worked out by hand from each
layer's shapes with DeepSpeed's rules (2 flops per multiply-accumulate; the bias of a
convolution, activations, norms, pooling and softmax per element), how a profile
attributes them to modules, and DeepSpeed's number formats."""

import re

import pytest
import torch
from torch import nn

from zerostream.profiling import (
    FlopsProfiler,
    duration_to_string,
    flops_to_string,
    get_model_profile,
    macs_to_string,
    number_to_string,
    params_to_string,
)


class MLP3(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.b = nn.Linear(16, 4)

    def forward(self, x):
        return self.b(self.act(self.a(x)))


class Fn(nn.Module):
    """A module around a function of its input (and of its own parameters, if any)."""

    def __init__(self, fn, *children):
        super().__init__()
        self.fn = fn
        self.inner = nn.ModuleList(children)

    def forward(self, *xs):
        return self.fn(self, *xs)


def _profile(model, *inputs):
    prof = FlopsProfiler(model)
    prof.start_profile()
    model(*inputs)
    prof.stop_profile()
    return prof


B = 5  # batch of the MLP
# (name, model, inputs, flops, MACs), each count from the shapes by hand.
CASES = [
    # Linear 8->16: B*8*16 MACs; ReLU: B*16 elements; Linear 16->4: B*16*4 MACs.
    ("mlp", MLP3, lambda: (torch.randn(B, 8),), 2 * B * 128 + B * 16 + 2 * B * 64, B * 192),
    # 3x3 conv, 3->4 channels, padding 1, on 2x3x6x6: 2*4*6*6 = 288 outputs of 27 MACs each,
    # and the bias adds 1 flop per output.
    (
        "conv_bias",
        lambda: nn.Conv2d(3, 4, 3, padding=1),
        lambda: (torch.randn(2, 3, 6, 6),),
        2 * 288 * 27 + 288,
        288 * 27,
    ),
    # Grouped conv 4->8, groups 2, no bias, on 2x4x3x3: 2*8*1*1 = 16 outputs of 3*3*2 MACs.
    (
        "conv_groups",
        lambda: nn.Conv2d(4, 8, 3, groups=2, bias=False),
        lambda: (torch.randn(2, 4, 3, 3),),
        2 * 16 * 18,
        16 * 18,
    ),
    # Transposed conv 2->3, k3, stride 2, on 1x2x4x4: each of the 16 input positions meets
    # 3*3 taps of 2*3 channel pairs; the bias adds 1 per output (1x3x9x9).
    (
        "conv_transpose",
        lambda: nn.ConvTranspose2d(2, 3, 3, stride=2),
        lambda: (torch.randn(1, 2, 4, 4),),
        2 * 16 * 9 * 6 + 3 * 9 * 9,
        16 * 9 * 6,
    ),
    # Batch norm in training with its affine transform: 5 per element (2x4x3x3 = 72).
    ("batch_norm_train", lambda: nn.BatchNorm2d(4), lambda: (torch.randn(2, 4, 3, 3),), 5 * 72, 0),
    # In eval: 2 per element with the affine transform.
    (
        "batch_norm_eval",
        lambda: nn.BatchNorm2d(4).eval(),
        lambda: (torch.randn(2, 4, 3, 3),),
        2 * 72,
        0,
    ),
    ("layer_norm", lambda: nn.LayerNorm(6), lambda: (torch.randn(2, 5, 6),), 5 * 60, 0),
    (
        "layer_norm_plain",
        lambda: nn.LayerNorm(6, elementwise_affine=False),
        lambda: (torch.randn(2, 5, 6),),
        4 * 60,
        0,
    ),
    ("group_norm", lambda: nn.GroupNorm(2, 4), lambda: (torch.randn(2, 4, 3, 3),), 5 * 72, 0),
    ("gelu", nn.GELU, lambda: (torch.randn(2, 5, 6),), 60, 0),
    ("silu", nn.SiLU, lambda: (torch.randn(2, 5, 6),), 60, 0),
    # Pooling: one per input element (2x4x6x6 = 288).
    ("max_pool", lambda: nn.MaxPool2d(2), lambda: (torch.randn(2, 4, 6, 6),), 288, 0),
    ("avg_pool", lambda: nn.AvgPool2d(2), lambda: (torch.randn(2, 4, 6, 6),), 288, 0),
    # Upsampling: one per output element (1x2x6x6).
    ("upsample", lambda: nn.Upsample(scale_factor=2), lambda: (torch.randn(1, 2, 3, 3),), 72, 0),
    ("softmax", lambda: nn.Softmax(dim=-1), lambda: (torch.randn(2, 3),), 6, 0),
    # (3x4) @ (4x5): 60 MACs.
    (
        "matmul",
        lambda: Fn(lambda m, x, y: torch.matmul(x, y)),
        lambda: (torch.randn(3, 4), torch.randn(4, 5)),
        120,
        60,
    ),
    # Attention of 1x2 heads, 4 queries and keys of width 8: Q K^T and A V, 2*4*4*8 MACs each.
    (
        "attention",
        lambda: Fn(lambda m, q, k, v: nn.functional.scaled_dot_product_attention(q, k, v)),
        lambda: tuple(torch.randn(1, 2, 4, 8) for _ in range(3)),
        2 * 512,
        512,
    ),
    # What DeepSpeed does not count: tanh, sigmoid, dropout, embedding, cross entropy.
    (
        "uncounted",
        lambda: Fn(
            lambda m, x: nn.functional.cross_entropy(
                m.inner[0](torch.sigmoid(torch.tanh(x))).sum(1), torch.tensor([1, 0])
            ),
            nn.Dropout(0.5),
        ),
        lambda: (torch.randn(2, 3, 4),),
        0,
        0,
    ),
]


@pytest.mark.parametrize("name, make, inputs, flops, macs", CASES, ids=[c[0] for c in CASES])
def test_counts_match_the_hand_count(name, make, inputs, flops, macs):
    torch.manual_seed(0)
    prof = _profile(make(), *inputs())
    assert (prof.get_total_flops(), prof.get_total_macs()) == (flops, macs)


def test_a_lenet_matches_deepspeeds_published_count():
    """LeNet-5 on 1024 32x32 images: DeepSpeed's own test expects 866,076,672 flops and
    426,516,480 MACs; per image, by hand: the convolutions' MACs 6*28*28*25 + 16*10*10*150
    + 120*400, the linears' 120*84 + 84*10; flops twice those plus the conv biases (one per
    output: 4704 + 1600 + 120), the pools (one per input: 4704 + 1600) and the softmax (10);
    the tanh layers count nothing."""
    model = nn.Sequential(
        nn.Conv2d(1, 6, 5), nn.Tanh(), nn.AvgPool2d(2),
        nn.Conv2d(6, 16, 5), nn.Tanh(), nn.AvgPool2d(2),
        nn.Conv2d(16, 120, 5), nn.Tanh(), nn.Flatten(),
        nn.Linear(120, 84), nn.Tanh(), nn.Linear(84, 10), nn.Softmax(dim=1),
    )  # fmt: skip
    macs = 6 * 28 * 28 * 25 + 16 * 10 * 10 * 150 + 120 * 400 + 120 * 84 + 84 * 10
    flops = 2 * macs + (4704 + 1600 + 120) + (4704 + 1600) + 10
    got = get_model_profile(
        model, (64, 1, 32, 32), print_profile=False, warm_up=0, as_string=False
    )  # 64 images keep it quick; the counts scale with the batch
    assert got == (64 * flops, 64 * macs, 61706)
    assert 1024 * flops == 866076672 and 1024 * macs == 426516480  # DeepSpeed's numbers


def test_modules_hold_what_ran_inside_them():
    lin1, lin2 = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(m, x):
        for block in m.inner:
            x = block(x)
        x = torch.relu(x)  # the parent's own work: 3*4 elements
        return m.inner[0](x)  # lin1 runs twice

    model = Fn(forward, lin1, lin2)
    prof = _profile(model, torch.randn(3, 4))
    linear = 2 * 3 * 4 * 4
    assert prof.get_module_profile(lin1).flops == 2 * linear
    assert prof.get_module_profile(lin1).calls == 2
    assert prof.get_module_profile(lin2).flops == linear
    # The ModuleList is never called: it holds the sum of its modules.
    assert prof.get_module_profile(model.inner).flops == 3 * linear
    assert prof.get_total_flops() == 3 * linear + 12
    assert prof.get_total_macs() == 3 * linear // 2
    assert prof.get_total_params() == 2 * (16 + 4)
    assert prof.get_total_duration() > 0


def test_ignored_modules_count_in_their_parent():
    model = MLP3()
    prof = FlopsProfiler(model)
    prof.start_profile(ignore_list=[nn.Linear])
    model(torch.randn(B, 8))
    assert prof.get_total_flops() == 2 * B * 192 + B * 16
    assert prof.get_module_profile(model.a).flops == 0
    assert prof.get_module_profile(model.act).flops == B * 16
    prof.end_profile()


def test_only_module_forwards_between_start_and_stop_count():
    model = MLP3()
    prof = FlopsProfiler(model)
    model(torch.randn(B, 8))  # before the profile
    prof.start_profile()
    out = model(torch.randn(B, 8))
    torch.mm(torch.randn(50, 50), torch.randn(50, 50))  # outside any module of the model
    out.sum().backward()  # backward is not the forward's
    counted = prof.get_total_flops()
    prof.stop_profile()
    model(torch.randn(B, 8))  # after stop_profile: the records stay, nothing adds to them
    assert counted == prof.get_total_flops() == 2 * B * 192 + B * 16
    prof.reset_profile()
    assert prof.get_total_flops() == 0
    prof.end_profile()
    assert not prof.started and prof.get_total_flops() == 0


def test_print_model_profile_to_a_file(tmp_path, capsys):
    model = MLP3()
    prof = _profile(model, torch.randn(B, 8))
    out = tmp_path / "deep" / "profile.txt"
    prof.print_model_profile(profile_step=7, top_modules=2, output_file=str(out))
    assert capsys.readouterr().out == ""
    text = out.read_text()
    assert "Profile Summary at step 7:" in text
    assert re.search(r"^fwd flops per GPU:\s+2 K$", text, re.M)
    assert re.search(r"^fwd MACs per GPU:\s+960 MACs$", text, re.M)
    assert re.search(r"^params per GPU:\s+212$", text, re.M)
    # The aggregated profile: both Linear layers summed at depth 1.
    assert "    params      - {'Linear': '212', 'ReLU': '0'}" in text
    assert "    MACs        - {'Linear': '960 MACs', 'ReLU': '0 MACs'}" in text
    # The tree: each module with its share.
    assert "(a): Linear(144 = 67.92% Params, 640 MACs = 66.67% MACs" in text
    assert (prof.flops, prof.macs, prof.params) == (2000, 960, 212)
    prof.end_profile()
    prof.print_model_profile()  # after end_profile: nothing to print
    assert capsys.readouterr().out == ""


def test_aggregated_profile_depths(capsys):
    model = MLP3()
    prof = _profile(model, torch.randn(B, 8))
    prof.print_model_aggregated_profile(module_depth=1, top_modules=1)
    one = capsys.readouterr().out
    assert "depth 0:" in one and "depth 1:" not in one
    prof.print_model_aggregated_profile(module_depth=-1, top_modules=1)
    every = capsys.readouterr().out
    assert "depth 1:" in every and "    params      - {'Linear': '212'}" in every


def test_get_model_profile_strings_and_errors(capsys):
    torch.manual_seed(0)
    got = get_model_profile(MLP3(), (B, 8), print_profile=False)
    assert got == ("2 K", "960 MACs", "212")
    got = get_model_profile(MLP3(), args=[torch.randn(B, 8)], as_string=False, detailed=False)
    assert got == (2000, 960, 212)
    assert "Detailed Profile" not in capsys.readouterr().out
    for bad, match in [
        (dict(input_shape=[B, 8]), "input_shape must be a non-empty tuple"),
        (dict(), "give input_shape, or args"),
        (dict(input_shape=(B, 8), mode="train"), 'mode must be "forward" or "generate"'),
    ]:
        with pytest.raises(ValueError, match=match):
            get_model_profile(MLP3(), **bad)
    with pytest.raises(ValueError, match="must be a torch.nn.Module"):
        get_model_profile(lambda x: x, (1,))


def test_number_formats_are_deepspeeds():
    assert number_to_string(1234567) == "1.23 M"
    assert number_to_string(0) == "0 "
    assert number_to_string(999) == "999 "
    assert number_to_string(0.0123) == "12.3 m"
    assert number_to_string(2.5e-5) == "25 u"
    assert number_to_string(3e9, units="M") == "3000 M"
    assert flops_to_string(2e12) == "2 TFLOPS"
    assert macs_to_string(100) == "100 MACs"
    assert params_to_string(1.5e9) == "1.5 B"
    assert params_to_string(110) == "110"
    assert params_to_string(2e9, units="B") == "2 B"
    assert duration_to_string(0.0123) == "12.3 ms"

"""The fused gradient statistics pass: squared norm and inf/nan flag."""

from __future__ import annotations

import math

import pytest
import torch

from zerostream.ops._cpu_optimizer import grad_stats

from .test_dispatch import LEVELS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_sum_squares_matches_double_reference(dtype):
    g = torch.randn(300_007, generator=torch.Generator().manual_seed(3)).to(dtype)
    view = g[3:]  # unaligned slice
    ref = (view.double() * 0.25).square().sum().item()
    for level in LEVELS:
        for threads in (1, 2):
            s, finite = grad_stats(view, 0.25, threads=threads, simd=level)
            assert finite
            assert math.isclose(s, ref, rel_tol=1e-12), (level, threads, s, ref)


def test_sum_squares_does_not_depend_on_thread_count():
    g = torch.randn(1_000_003)
    assert grad_stats(g, threads=1)[0] == grad_stats(g, threads=2)[0]


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_nonfinite_is_flagged(dtype, bad):
    for where in (0, 17, 99_999):
        g = torch.ones(100_000, dtype=dtype)
        g[where] = bad
        for level in LEVELS:
            _, finite = grad_stats(g, simd=level)
            assert not finite, (dtype, bad, where, level)


def test_empty_and_bad_input():
    assert grad_stats(torch.zeros(0)) == (0.0, True)
    with pytest.raises(ValueError, match="grad"):
        grad_stats(torch.zeros(4, dtype=torch.float64))

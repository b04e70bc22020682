"""Every dispatch level this CPU supports, 1 or 2 threads, streaming stores on or off: the
same bits (see Note [One math, three ISAs] in csrc/optim/kernels/kernel_table.h)."""

from __future__ import annotations

import pytest
import torch

from zerostream import _C
from zerostream.ops.adagrad import cpu_adagrad_step
from zerostream.ops.adam import cpu_adam_step
from zerostream.ops.lion import cpu_lion_step


def _supported_levels():
    info = _C.cpu_info()
    levels = ["scalar"]
    if info["avx2"] and info["fma"] and info["f16c"]:
        levels.append("avx2")
    if info["avx512f"] and info["avx512bw"] and info["avx512vl"]:
        levels.append("avx512")
    return levels


LEVELS = _supported_levels()
# Large enough that two threads each get a chunk (the kernels keep calls under 2 x 32 Ki
# elements on one thread), odd so that every chunk edge and tail case occurs.
NUMEL = 150_001
OFFSET = 5  # unaligned start inside a larger buffer


def _run(kind, level, threads, nontemporal, grad_dtype, copy_dtype, steps=3):
    gen = torch.Generator().manual_seed(7)
    total = NUMEL + 2 * OFFSET
    p = torch.randn(total, generator=gen)
    s = [torch.zeros(total) for _ in range(2)]
    copy = torch.zeros(total, dtype=copy_dtype)
    sl = slice(OFFSET, OFFSET + NUMEL)
    for step in range(1, steps + 1):
        g = torch.randn(total, generator=gen).to(grad_dtype)[sl]
        kw = dict(threads=threads, simd=level, nontemporal=nontemporal, param_copy=copy[sl])
        if kind == "adam":
            cpu_adam_step(
                p[sl],
                g,
                s[0][sl],
                s[1][sl],
                lr=1e-2,
                weight_decay=0.01,
                step=step,
                grad_scale=0.5,
                **kw,
            )
        elif kind == "adagrad":
            cpu_adagrad_step(p[sl], g, s[0][sl], lr=1e-2, weight_decay=0.01, **kw)
        else:
            cpu_lion_step(p[sl], g, s[0][sl], lr=1e-2, weight_decay=0.01, **kw)
    return [p, s[0], s[1], copy]


@pytest.mark.parametrize("kind", ["adam", "adagrad", "lion"])
@pytest.mark.parametrize(
    "grad_dtype,copy_dtype",
    [
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.float16),
        (torch.float16, torch.bfloat16),
    ],
    ids=["g_fp32-c_bf16", "g_bf16-c_fp16", "g_fp16-c_bf16"],
)
def test_levels_threads_and_stores_agree_bitwise(kind, grad_dtype, copy_dtype):
    base = _run(kind, "scalar", 1, "off", grad_dtype, copy_dtype)
    for level in LEVELS:
        for threads in (1, 2):
            for nt in ("off", "on", "copy"):
                got = _run(kind, level, threads, nt, grad_dtype, copy_dtype)
                for name, a, b in zip(("param", "state0", "state1", "copy"), got, base):
                    assert torch.equal(a, b), f"{kind} {level} threads={threads} nt={nt}: {name}"


def test_zs_simd_caps_the_level(monkeypatch):
    for level in LEVELS:
        monkeypatch.setenv("ZS_SIMD", level)
        assert _C.optim.simd_level() == level
    monkeypatch.setenv("ZS_SIMD", "scalar")
    assert _C.optim.simd_level("avx512") == "scalar"


def test_bad_simd_name_is_a_value_error():
    with pytest.raises(ValueError, match="simd"):
        cpu_adam_step(
            torch.zeros(4),
            torch.zeros(4),
            torch.zeros(4),
            torch.zeros(4),
            lr=1e-3,
            step=1,
            simd="sse9",
        )

"""The GPT that `zerostream bench step` trains: GPT-2's shape (pre-norm blocks, causal
self-attention, 4x MLP, tied embedding and head), random initialisation, synthetic tokens.
Nothing is downloaded; the same seed gives every peer the same weights and the same data."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Tuple

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTShape:
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int

    @property
    def params(self) -> int:
        """Parameter count (tied head): embeddings + per layer 12 h^2 + 13 h + final norm."""
        h = self.hidden
        return self.vocab * h + self.seq * h + self.layers * (12 * h * h + 13 * h) + 2 * h


# Named sizes. "xl" is the GPU data-path issue's GPT-2 XL-sized case (vocab 8192, seq 512).
SIZES = {
    "tiny": GPTShape(layers=2, hidden=64, heads=4, vocab=512, seq=64),
    "small": GPTShape(layers=4, hidden=256, heads=4, vocab=2048, seq=128),
    "gpt2": GPTShape(layers=12, hidden=768, heads=12, vocab=8192, seq=512),
    "medium": GPTShape(layers=24, hidden=1024, heads=16, vocab=8192, seq=512),
    "xl": GPTShape(layers=48, hidden=1600, heads=25, vocab=8192, seq=512),
}


class _WideMatmul(torch.autograd.Function):
    """x @ w.T (+ b) with 16-bit operands widened to fp32 and the results rounded back: the
    GEMMs run in MKL's sgemm. Accumulation is fp32 either way; only the summation order can
    differ from torch's own 16-bit GEMM."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        y = x.float() @ w.float().t()
        if b is not None:
            y += b.float()
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        g32 = g.float()
        gx = (g32 @ w.float()).to(x.dtype)
        gw = (g32.reshape(-1, g.shape[-1]).t() @ x.float().reshape(-1, x.shape[-1])).to(w.dtype)
        gb = g32.reshape(-1, g.shape[-1]).sum(0).to(w.dtype) if ctx.has_bias else None
        return gx, gw, gb


def wide_linear(x: torch.Tensor, w: torch.Tensor, b=None) -> torch.Tensor:
    return _WideMatmul.apply(x, w, b)


class WideLinear(torch.nn.Linear):
    """nn.Linear whose 16-bit matmuls run in fp32 (_WideMatmul). For CPUs without bf16 GEMM
    hardware (AVX-512 BF16, AMX), where torch's bf16 GEMM is a scalar fallback about 25x
    slower than sgemm at these shapes: a bf16 benchmark there measures that fallback, not
    the offload it is for (GPT(wide_matmul=True), bench capacity --wide-matmul)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype == torch.float32:
            return super().forward(x)
        return wide_linear(x, self.weight, self.bias)


class Block(torch.nn.Module):
    def __init__(self, s: GPTShape, wide_matmul: bool = False):
        super().__init__()
        linear = WideLinear if wide_matmul else torch.nn.Linear
        self.heads = s.heads
        self.ln1 = torch.nn.LayerNorm(s.hidden)
        self.qkv = linear(s.hidden, 3 * s.hidden)
        self.proj = linear(s.hidden, s.hidden)
        self.ln2 = torch.nn.LayerNorm(s.hidden)
        self.up = linear(s.hidden, 4 * s.hidden)
        self.down = linear(4 * s.hidden, s.hidden)
        self.proj.residual_out = self.down.residual_out = True  # GPT-2's scaled init

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, h // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, h))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self, s: GPTShape, wide_matmul: bool = False):
        super().__init__()
        if s.hidden % s.heads:
            raise ValueError(f"hidden {s.hidden} is not a multiple of heads {s.heads}")
        self.shape = s
        self.wide_matmul = wide_matmul  # 16-bit matmuls in fp32 (WideLinear)
        self.tok = torch.nn.Embedding(s.vocab, s.hidden)
        self.pos = torch.nn.Embedding(s.seq, s.hidden)
        self.blocks = torch.nn.ModuleList(Block(s, wide_matmul) for _ in range(s.layers))
        self.ln = torch.nn.LayerNorm(s.hidden)
        # GPT-2's initialisation, module by module through apply(), which zero.Init wraps
        # to gather each module's params around it: the same weights with or without it.
        self.apply(self._init_module)

    def _init_module(self, m: torch.nn.Module) -> None:
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
            scaled = getattr(m, "residual_out", False)
            std = 0.02 / math.sqrt(2 * self.shape.layers) if scaled else 0.02
            torch.nn.init.normal_(m.weight, std=std)
        if isinstance(m, torch.nn.Linear) and m.bias is not None:
            torch.nn.init.zeros_(m.bias)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        head = self.tok.weight  # tied
        wide = self.wide_matmul and head.dtype != torch.float32
        logits = (wide_linear if wide else F.linear)(self.ln(x), head)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def batches(
    shape: GPTShape, micro: int, device, seed: int = 1
) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """Endless synthetic (tokens, next tokens) micro-batches, the same for every peer."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        data = torch.randint(0, shape.vocab, (micro, shape.seq + 1), generator=gen)
        yield data[:, :-1].contiguous().to(device), data[:, 1:].contiguous().to(device)

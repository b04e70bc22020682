"""A small GPT-style model for parity tests: token and position embeddings, causal attention,
MLP, layer norms and an output head tied to the token embedding."""

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        # No qkv bias: the key bias has a zero true gradient, which turns rounding noise into
        # full-size Adam steps and breaks parity for reasons unrelated to ZeRO (TESTING.md).
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """`checkpoint`: None, "reentrant" or "non_reentrant" activation checkpointing of each
    block; `reuse`: the last block runs twice per forward (a module called several times)."""

    def __init__(
        self,
        vocab: int = 64,
        d: int = 32,
        heads: int = 2,
        layers: int = 2,
        seq: int = 16,
        checkpoint=None,
        reuse: bool = False,
    ):
        super().__init__()
        self.checkpoint, self.reuse = checkpoint, reuse
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        blocks = list(self.blocks) + ([self.blocks[-1]] if self.reuse else [])
        for blk in blocks:
            if self.checkpoint:
                reentrant = self.checkpoint == "reentrant"
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=reentrant)
            else:
                x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_batches(steps: int, global_batch: int, seq: int = 16, vocab: int = 64, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab, (steps, global_batch, seq + 1), generator=g)
    return data[..., :-1], data[..., 1:]


def train_data_parallel(engine, rank, world, steps, global_batch, first=0):
    """Steps first..first+steps-1 of make_batches(global_batch), each rank taking its slice of
    the batch; returns the losses averaged over the ranks."""
    import torch.distributed as dist

    micro = global_batch // world
    xs, ys = make_batches(first + steps, global_batch)
    losses = []
    for s in range(first, first + steps):
        lo = rank * micro
        loss = engine(xs[s][lo : lo + micro], ys[s][lo : lo + micro])
        engine.backward(loss)
        engine.step()
        total = loss.detach().float().clone()
        dist.all_reduce(total)
        losses.append(float(total) / world)
    return losses


def plain_adamw_losses(
    steps: int, global_batch: int, lr, betas, weight_decay, clip, dtype=torch.float32
):
    """The plain-PyTorch reference of the parity tests: TinyGPT from seed 0 in `dtype`, AdamW
    on its own parameters (moments in `dtype` too), the whole global batch per step, gradient
    norm clipped to `clip`. Returns the losses."""
    torch.manual_seed(0)
    model = TinyGPT().to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
    xs, ys = make_batches(steps, global_batch)
    losses = []
    for s in range(steps):
        loss = model(xs[s], ys[s])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def adamw_ds_config(micro: int, zero: dict, lr, betas, weight_decay, clip, **sections) -> dict:
    """The ds_config of plain_adamw_losses' optimizer: AdamW with these hyperparameters,
    clipping `clip`, no accumulation, the `zero` section and any other `sections`."""
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": clip,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": lr, "betas": list(betas), "weight_decay": weight_decay},
        },
        "zero_optimization": zero,
        **sections,
    }

"""The model the planner sizes: a dense decoder-only transformer described by a Hugging Face
config (Llama-style: RMSNorm, gated MLP, rotary; or GPT-2-style: LayerNorm, GELU MLP,
learned positions, biases) or by a bare parameter count with an assumed shape.

It answers three questions for the planner: how many parameters (exactly, for a config),
which modules own which parameters in execution order (the stage-3 gather trace, and
DeepSpeed's "largest layer"), and how many activation bytes a micro-batch keeps.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .units import count

# Model types whose MLP is gated (gate, up, down: 3 matrices) and has no biases.
_GATED = {
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "phi3",
    "olmo",
    "olmo2",
    "internlm2",
    "granite",
    "cohere",
    "yi",
    "baichuan",
}
# GPT-2-like: LayerNorm with bias, 2-matrix MLP with biases.
_PLAIN = {"gpt2", "gpt_bigcode", "gpt_neox", "gptj", "gpt_neo", "opt", "bloom", "falcon", "phi"}
_MOE_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")

# Keys of the quantities the planner needs, HF names first, then GPT-2's and others'.
_KEYS = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head"),
    "vocab": ("vocab_size",),
}


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    intermediate: int
    gated_mlp: bool  # SwiGLU-style gate/up/down (Llama) vs up/down with GELU (GPT-2)
    positions: int  # learned position embeddings (GPT-2); 0 with rotary embeddings
    tied_embeddings: bool  # the LM head reuses the token embedding
    biases: bool  # linear layers and norms have biases (GPT-2 style)
    family: str  # "llama-style" / "gpt2-style"
    source: str
    params_override: Optional[int] = None  # --params given: the count to use
    assumptions: Tuple[str, ...] = field(default=())

    # --- parameters --------------------------------------------------------------------------
    @property
    def kv_dim(self) -> int:
        return self.hidden // self.heads * self.kv_heads

    def modules(self) -> List[Tuple[str, List[int]]]:
        """(module, [numel of each of its own parameters]) in forward order, the unit in
        which ZeRO-3 gathers. The tied LM head is listed again as a use of the embedding."""
        h, i, kv = self.hidden, self.intermediate, self.kv_dim
        norm = [h, h] if self.biases else [h]

        def linear(n_in, n_out):
            return [n_in * n_out] + ([n_out] if self.biases else [])

        mods: List[Tuple[str, List[int]]] = [("embed_tokens", [self.vocab * h])]
        if self.positions:
            mods.append(("embed_positions", [self.positions * h]))
        for layer in range(self.layers):
            p = f"layers.{layer}."
            mods.append((p + "norm1", norm))
            if self.gated_mlp:  # separate q, k, v projections (grouped-query attention)
                mods += [
                    (p + "q_proj", linear(h, h)),
                    (p + "k_proj", linear(h, kv)),
                    (p + "v_proj", linear(h, kv)),
                ]
            else:
                mods.append((p + "qkv", linear(h, h + 2 * kv)))
            mods += [(p + "o_proj", linear(h, h)), (p + "norm2", norm)]
            if self.gated_mlp:
                mods += [(p + "gate_proj", linear(h, i)), (p + "up_proj", linear(h, i))]
            else:
                mods.append((p + "up_proj", linear(h, i)))
            mods.append((p + "down_proj", linear(i, h)))
        mods.append(("final_norm", norm))
        if not self.tied_embeddings:
            mods.append(("lm_head", [self.vocab * h]))
        return mods

    @property
    def shape_params(self) -> int:
        """Parameters of the described shape (each tensor once)."""
        return sum(sum(p) for _, p in self.modules())

    @property
    def params(self) -> int:
        return self.params_override if self.params_override else self.shape_params

    @property
    def largest_layer_params(self) -> int:
        """DeepSpeed's largest_layer_params: the largest sum of one module's own params."""
        return max(sum(p) for _, p in self.modules())

    def describe(self) -> str:
        kv = f" ({self.kv_heads} kv)" if self.kv_heads != self.heads else ""
        text = (
            f"{self.family} model, {count(self.params)} params ({self.source}: "
            f"{self.layers} layers, hidden {self.hidden}, {self.heads} heads{kv}, "
            f"vocab {self.vocab}, intermediate {self.intermediate})"
        )
        return text

    # --- activations -------------------------------------------------------------------------
    def layer_activation_bytes(self, tokens: int, dtype_bytes: int) -> int:
        """Bytes one layer's forward keeps for backward (torch SDPA/flash attention: no
        seq^2 score matrix; no dropout). GPT-2-style, in elements per token: the block
        input and its LayerNorm output (2h), the qkv output (h + 2 kv), the attention output
        and its re-laid-out copy (2h), the residual after attention and its norm (2h), the
        MLP's up and activation outputs (2I): 16.5h for I = 4h measured with torch's
        saved-tensor hooks against 17h here. Llama-style: RMSNorm keeps an fp32 copy of its
        input and the normalised value (4h + d h bytes, twice), the rotated q and k, v, the
        attention output, the o_proj input, the gate, up, SiLU and product outputs (4I)."""
        h, i, kv, d = self.hidden, self.intermediate, self.kv_dim, dtype_bytes
        if self.gated_mlp:
            per_token = d * (5 * h + 2 * kv + 4 * i) + 2 * (4 * h + d * h)
        else:
            per_token = d * (7 * h + 2 * kv + 2 * i)
        return tokens * per_token

    def head_activation_bytes(self, tokens: int, dtype_bytes: int) -> int:
        """The final norm's output and the loss: the fp32 log-softmax output the loss keeps,
        its gradient and the fp32 logits' gradient (12 B per vocab entry), plus the 16-bit
        logits' gradient when the model is not fp32."""
        d = dtype_bytes
        return tokens * (d * self.hidden + self.vocab * (12 + (d if d < 4 else 0)))

    def activation_bytes(self, tokens: int, dtype_bytes: int, checkpointing: bool) -> Dict:
        """Peak activation bytes of one micro-batch, itemised. With activation checkpointing
        every layer keeps only its input (h per token); backward then re-runs one layer's
        forward (its full activations) and needs about as much again for that layer's
        gradients. Without it every layer keeps its full set, plus the one layer's gradient
        workspace."""
        layer = self.layer_activation_bytes(tokens, dtype_bytes)
        if checkpointing:
            kept = self.layers * tokens * self.hidden * dtype_bytes
            work = 2 * layer
        else:
            kept = self.layers * layer
            work = layer
        head = self.head_activation_bytes(tokens, dtype_bytes)
        return {"layers": kept, "layer_backward": work, "head": head}

    # --- the stage-3 gather trace -------------------------------------------------------------
    def gather_trace(self) -> Tuple[List[Tuple[int, List[int]]], List[int]]:
        """(events, param numels) for zerostream._C.plan_prefetch: one event per module
        invocation, forward then backward in reverse, as zerostream's coordinator records
        them. Parameter ids index the numel list; the tied head re-uses the embedding's."""
        numels: List[int] = []
        events: List[Tuple[int, List[int]]] = []
        for m, (_, params) in enumerate(self.modules()):
            ids = list(range(len(numels), len(numels) + len(params)))
            numels += params
            events.append((m, ids))
        if self.tied_embeddings:
            events.append((len(events), events[0][1]))
        return events + events[::-1], numels


# --- building a shape -------------------------------------------------------------------------


def _first(cfg: dict, keys: Sequence[str], path: str, meaning: str) -> int:
    for k in keys:
        if cfg.get(k) is not None:
            value = cfg[k]
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{path}: {k!r} must be a positive integer; got {value!r}")
            return value
    names = " or ".join(repr(k) for k in keys)
    raise ValueError(f"{path}: missing key {names} ({meaning})")


def from_hf_config(cfg: dict, path: str = "config.json") -> ModelShape:
    """A ModelShape from a Hugging Face config dict; ValueError names the missing key."""
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    if "text_config" in cfg and "hidden_size" not in cfg:
        cfg = cfg["text_config"]  # multimodal wrappers keep the language model here
    for k in _MOE_KEYS:
        if cfg.get(k):
            raise ValueError(
                f"{path}: {k!r} = {cfg[k]}: mixture-of-experts models are not modelled by "
                f"the planner (dense transformers only); give --params with the total count"
            )
    hidden = _first(cfg, _KEYS["hidden"], path, "the hidden size")
    layers = _first(cfg, _KEYS["layers"], path, "the number of layers")
    heads = _first(cfg, _KEYS["heads"], path, "the number of attention heads")
    vocab = _first(cfg, _KEYS["vocab"], path, "the vocabulary size")
    if hidden % heads:
        raise ValueError(f"{path}: hidden size {hidden} is not a multiple of {heads} heads")
    model_type = str(cfg.get("model_type", "")).lower()
    gpt2_names = "n_embd" in cfg and "hidden_size" not in cfg
    assumptions = []
    if model_type in _PLAIN or gpt2_names:
        gated, biases, family = False, True, "gpt2-style"
    elif model_type in _GATED:
        gated, biases, family = True, False, "llama-style"
    else:
        act = str(cfg.get("hidden_act", cfg.get("activation_function", ""))).lower()
        gated = act in ("silu", "swiglu", "swish") or "intermediate_size" in cfg
        biases, family = not gated, "llama-style" if gated else "gpt2-style"
        assumptions.append(
            f"model_type {model_type or '(none)'!r} is not one the planner knows: sized as "
            f"{family} ({'gated' if gated else 'GELU'} MLP{', biases' if biases else ''})"
        )
    if gated:
        intermediate = _first(cfg, ("intermediate_size",), path, "the MLP width")
    else:
        inner = cfg.get("n_inner", cfg.get("intermediate_size", cfg.get("ffn_dim")))
        intermediate = (
            _first(cfg, ("n_inner", "intermediate_size", "ffn_dim"), path, "the MLP width")
            if inner is not None
            else 4 * hidden
        )
    kv_heads = cfg.get("num_key_value_heads") or heads
    if not isinstance(kv_heads, int) or heads % kv_heads:
        raise ValueError(
            f"{path}: 'num_key_value_heads' must divide 'num_attention_heads' ({heads}); "
            f"got {kv_heads!r}"
        )
    positions = 0
    if not gated and model_type not in ("gpt_neox", "gptj", "falcon", "bloom", "phi"):
        positions = cfg.get("n_positions", cfg.get("max_position_embeddings")) or 0
        if positions == 0:
            raise ValueError(f"{path}: missing key 'n_positions' (learned position embeddings)")
    tied = cfg.get("tie_word_embeddings")
    if tied is None:
        tied = not gated  # HF: GPT-2 ties its head; Llama-style configs say false
    return ModelShape(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        vocab=vocab,
        intermediate=intermediate,
        gated_mlp=gated,
        positions=positions,
        tied_embeddings=bool(tied),
        biases=biases,
        family=family,
        source=f"config {os.path.basename(path)}",
        assumptions=tuple(assumptions),
    )


def load_hf_config(path: str) -> ModelShape:
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except OSError as exc:
        raise ValueError(f"--model-config: cannot read {path!r}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"--model-config: {path} is not JSON: {exc}") from exc
    return from_hf_config(cfg, path)


def assumed_shape(params: int, vocab: int = 32000) -> ModelShape:
    """A Llama-style shape for a bare parameter count (activations and the largest layer
    need one): hidden/layers about 128 as in Llama 2 7B/13B, 12 h^2 parameters per layer,
    hidden a multiple of 128, heads of 128, intermediate 8/3 h rounded up to 256."""
    hidden = max(128, round((128 * params / 12) ** (1 / 3) / 128) * 128)
    layers = max(1, round(params / (12 * hidden * hidden)))
    inter = -(-(8 * hidden // 3) // 256) * 256
    heads = hidden // 128
    return ModelShape(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=heads,
        vocab=vocab,
        intermediate=inter,
        gated_mlp=True,
        positions=0,
        tied_embeddings=False,
        biases=False,
        family="llama-style",
        source="--params",
        params_override=params,
        assumptions=(
            f"shape assumed from the parameter count: {layers} layers, hidden {hidden}, "
            f"vocab {vocab} (Llama-like); give --model-config for exact activations",
        ),
    )

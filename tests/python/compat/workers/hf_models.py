"""Tiny Hugging Face models (built from a config, nothing downloaded), their data, and the
DeepSpeed configs the compat tests hand to Trainer and Accelerate ("auto" where Trainer
fills values in)."""

from __future__ import annotations

import torch

VOCAB, SEQ = 128, 16
BATCH, GAS, STEPS = 4, 2, 3  # per-device micro-batch, accumulation, optimizer steps
LR = 1e-3


def make_model(kind: str, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if kind == "gpt2":
        # No dropout: two runs would draw different masks.
        cfg = GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=2,
            vocab_size=VOCAB,
            n_positions=SEQ,
            bos_token_id=0,
            eos_token_id=0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        return GPT2LMHeadModel(cfg)
    if kind == "llama":
        cfg = LlamaConfig(
            num_hidden_layers=2,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=VOCAB,
            max_position_embeddings=SEQ,
        )
        return LlamaForCausalLM(cfg)
    raise ValueError(f"unknown model kind {kind!r}")


class TokenData(torch.utils.data.Dataset):
    """Random token sequences, labels = inputs (causal LM loss)."""

    def __init__(self, n: int, seed: int = 3):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def ds_config(stage: int, offload_optimizer: str, offload_param: str, nvme: str, **extra):
    """A config as a Trainer user writes it: "auto" for what TrainingArguments and the model
    decide. `config_optimizer` puts an AdamW section in (else Trainer's own optimizer)."""
    zero = {
        "stage": stage,
        "reduce_bucket_size": "auto",
        "offload_optimizer": {"device": offload_optimizer, "nvme_path": nvme},
    }
    if stage == 3:
        zero["offload_param"] = {"device": offload_param, "nvme_path": nvme}
        zero["stage3_prefetch_bucket_size"] = "auto"
        zero["stage3_param_persistence_threshold"] = "auto"
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        if offload_param == "nvme":
            zero["offload_param"]["max_in_cpu"] = 0
    cfg = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
    }
    if extra.pop("config_optimizer", False):
        cfg["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }
    cfg.update(extra)
    return cfg

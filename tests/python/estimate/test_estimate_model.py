"""The planner's model: parameter counts against published ones and against torch modules,
activation bytes against what autograd really saves, and input parsing errors that name the
flag or the key."""

import pytest
import torch
from hf_configs import LLAMA2_70B

from zerostream.bench.gpt import GPT, GPTShape
from zerostream.estimate import assumed_shape, from_hf_config
from zerostream.estimate.units import parse_count, parse_size

GPT2_SMALL = {  # Hugging Face's gpt2 config.json (n_inner null: 4 x n_embd)
    "model_type": "gpt2",
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
    "n_inner": None,
}


@pytest.mark.parametrize(
    "cfg, published",
    [
        (LLAMA2_70B, 68_976_648_192),  # Llama-2-70b-hf's parameter count
        (GPT2_SMALL, 124_439_808),  # gpt2 (tied head)
        (  # Llama-2-7b-hf
            {
                "model_type": "llama",
                "hidden_size": 4096,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "vocab_size": 32000,
                "intermediate_size": 11008,
            },
            6_738_415_616,
        ),
        (  # Mistral-7B-v0.1: grouped-query attention, 8 kv heads
            {
                "model_type": "mistral",
                "hidden_size": 4096,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "vocab_size": 32000,
                "intermediate_size": 14336,
                "tie_word_embeddings": False,
            },
            7_241_732_096,
        ),
    ],
    ids=["llama2-70b", "gpt2", "llama2-7b", "mistral-7b"],
)
def test_parameter_count_matches_the_published_one(cfg, published):
    assert from_hf_config(cfg).params == published


def test_parameter_count_and_largest_layer_match_the_torch_module():
    shape = GPTShape(layers=3, hidden=96, heads=4, vocab=500, seq=40)
    model = GPT(shape)
    mine = from_hf_config(
        {
            "model_type": "gpt2",
            "n_embd": 96,
            "n_layer": 3,
            "n_head": 4,
            "vocab_size": 500,
            "n_positions": 40,
        }
    )
    assert mine.params == sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    assert mine.largest_layer_params == largest


def test_llama_70b_largest_layer_is_the_embedding():
    assert from_hf_config(LLAMA2_70B).largest_layer_params == 32000 * 8192


def _saved_bytes(model, tokens, targets) -> int:
    """Bytes of the distinct storages autograd saves for backward."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens, targets)
    return sum(seen.values())


def test_activation_bytes_match_what_autograd_saves():
    """The per-layer count (17 h per token for GPT-2 shapes) against torch's saved tensors
    of bench/gpt.py's GPT; the loss head's saved part is its fp32 log-softmax (4 B x vocab)."""
    shape = GPTShape(layers=4, hidden=128, heads=4, vocab=256, seq=256)
    mine = from_hf_config(
        {
            "model_type": "gpt2",
            "n_embd": 128,
            "n_layer": 4,
            "n_head": 4,
            "vocab_size": 256,
            "n_positions": 256,
        }
    )
    torch.manual_seed(0)
    x = torch.randint(0, 256, (8, 256))
    measured = _saved_bytes(GPT(shape), x, x)
    tokens = 8 * 256
    predicted = shape.layers * mine.layer_activation_bytes(tokens, 4) + tokens * (
        4 * 256 + 2 * 4 * 128
    )  # log-softmax output, final norm's input and output
    assert predicted == pytest.approx(measured, rel=0.05)


def test_checkpointing_keeps_layer_inputs_only():
    shape = from_hf_config(LLAMA2_70B)
    act = shape.activation_bytes(4096, 2, checkpointing=True)
    assert act["layers"] == 80 * 4096 * 8192 * 2
    full = shape.activation_bytes(4096, 2, checkpointing=False)
    assert full["layers"] == 80 * shape.layer_activation_bytes(4096, 2)
    # bf16 head: fp32 log-softmax, its gradient, the fp32 and bf16 logits' gradients
    assert act["head"] == 4096 * (2 * 8192 + 32000 * 14)


def test_assumed_shape_keeps_the_count_and_says_so():
    shape = assumed_shape(70 * 10**9)
    assert shape.params == 70 * 10**9
    assert 60 <= shape.layers <= 90 and shape.hidden % 128 == 0
    assert abs(shape.shape_params - shape.params) / shape.params < 0.1
    assert "assumed" in shape.assumptions[0]


@pytest.mark.parametrize(
    "cfg, key",
    [
        ({**LLAMA2_70B, "intermediate_size": None}, "intermediate_size"),
        ({k: v for k, v in LLAMA2_70B.items() if k != "vocab_size"}, "vocab_size"),
        ({k: v for k, v in GPT2_SMALL.items() if k != "n_head"}, "num_attention_heads"),
        ({k: v for k, v in GPT2_SMALL.items() if k != "n_positions"}, "n_positions"),
        ({**LLAMA2_70B, "hidden_size": "8192"}, "hidden_size"),
        ({**LLAMA2_70B, "num_key_value_heads": 7}, "num_key_value_heads"),
        ({**LLAMA2_70B, "num_local_experts": 8}, "num_local_experts"),
    ],
    ids=["no-intermediate", "no-vocab", "no-heads", "no-positions", "string", "kv", "moe"],
)
def test_config_errors_name_the_key(cfg, key):
    with pytest.raises(ValueError, match=key):
        from_hf_config(cfg, "my.json")


def test_counts_and_sizes():
    assert parse_count("70B") == 70_000_000_000
    assert parse_count("1.3B") == 1_300_000_000
    assert parse_count("350m") == 350_000_000
    assert parse_count("7e10") == 70_000_000_000
    assert parse_count("124439808") == 124_439_808
    assert parse_size("40GB") == 40 * 10**9
    assert parse_size("80GiB") == 80 * 2**30
    assert parse_size("1TB") == 10**12
    assert parse_size("40") == 40 * 10**9
    assert parse_size("512 MiB") == 512 * 2**20


@pytest.mark.parametrize("text", ["70X", "", "B", "-5B", "0", "seventy"])
def test_bad_counts_name_the_flag(text):
    with pytest.raises(ValueError, match="--params"):
        parse_count(text, "--params")


@pytest.mark.parametrize("text", ["40XB", "GB", "-1GB", "forty"])
def test_bad_sizes_name_the_flag(text):
    with pytest.raises(ValueError, match="--gpu-mem"):
        parse_size(text, "--gpu-mem")

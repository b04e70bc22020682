"""Hugging Face config.json contents the estimate tests size: Llama-2-70B's (the issue's 70B
on 8x40 GB case)."""

LLAMA2_70B = {
    "model_type": "llama",
    "hidden_size": 8192,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "intermediate_size": 28672,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}

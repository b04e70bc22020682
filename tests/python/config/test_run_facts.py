"""config.RunFacts: the one list of what a run knows when its config is read, which validate()
and load() both take as keywords (they once each spelled the nine out)."""

import pytest

from zerostream import config


def test_load_and_validate_take_the_same_facts_and_refuse_an_unknown_one():
    raw = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2,
           "gradient_accumulation_steps": "auto"}  # fmt: skip
    cfg = config.load(raw, world_size=4, gradient_accumulation_steps=3)
    assert cfg.train_batch_size == 24
    checked = config.validate(raw, world_size=4, gradient_accumulation_steps=3)
    assert checked["ok"]
    assert checked["resolved"]["train_batch_size"]["value"] == 24
    for call in (config.load, config.validate):
        with pytest.raises(TypeError, match="world_sise"):
            call(raw, world_sise=4)


def test_the_native_context_carries_every_fact():
    facts = config.RunFacts(world_size=8, hidden_size=512, lr=0.5, model_dtype="bf16")
    ctx = facts.native(require_batch=False)
    assert (ctx.world_size, ctx.hidden_size, ctx.lr, ctx.model_dtype) == (8, 512, 0.5, "bf16")
    assert ctx.require_batch is False

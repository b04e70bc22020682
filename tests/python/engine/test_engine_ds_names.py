"""Engine names DeepSpeed's own tests read: the optimizer-state file a checkpoint holds
(`_get_optimizer_ckpt_name`, which they patch to see whether a load reads it) and the modules
with sparse gradients (`sparse_tensor_module_names`, compared between a saved and a loaded
engine)."""

import os

import pytest
import torch


@pytest.mark.parametrize("stage, bf16", [(1, False), (2, True), (3, False)])
def test_the_optimizer_ckpt_name_is_the_file_a_save_writes(tmp_path, stage, bf16):
    import zerostream

    torch.manual_seed(0)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "bf16": {"enabled": bf16},
        "zero_optimization": {"stage": stage},
    }
    engine, *_ = zerostream.initialize(model=torch.nn.Linear(4, 4), config=config)
    loss = engine(torch.ones(2, 4, dtype=torch.bfloat16 if bf16 else torch.float32)).sum()
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(str(tmp_path), tag="t1")
    name = engine._get_optimizer_ckpt_name(str(tmp_path), "t1", 0)
    assert os.path.isfile(name), (name, sorted(os.listdir(tmp_path / "t1")))
    assert os.path.dirname(name) == str(tmp_path / "t1")
    assert engine.sparse_tensor_module_names == set()
    engine.destroy()

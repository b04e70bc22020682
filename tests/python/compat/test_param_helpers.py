"""DeepSpeed's param helpers (`deepspeed.utils.safe_get_full_fp32_param` and friends) on 2
Gloo ranks at ZeRO stages 0-3, the optimizer state in the device, the host arena (offload
cpu) and the NVMe swap store, against a plain single-process torch.optim.AdamW run from the
same seed: after 3 steps the gathered fp32 weights, Adam's moments and the next gradient
equal the reference's; values set through the helpers read back exactly, and a step after
setting weights, moments and gradients lands where the reference lands after the same
edits. The workers import the installed compatibility package (param_helpers_worker.py)."""

import pytest
import torch
from workers import param_helpers_worker as w

from multirank import run_ranks

# name: (stage, offload_optimizer, train with engine.optimizer.backward)
SCENARIOS = {
    "stage0": (0, "none", False),
    "stage1": (1, "none", True),
    "stage2_cpu": (2, "cpu", False),
    "stage2_nvme": (2, "nvme", True),
    "stage3": (3, "none", False),
    "stage3_nvme": (3, "nvme", False),  # offload_param nvme too
}
TOL = {"rtol": 1e-5, "atol": 1e-6}  # the fused CPU Adam kernel against torch's AdamW


@pytest.fixture(scope="module")
def runs(compat_site, tmp_path_factory):
    nvme = tmp_path_factory.mktemp("nvme")
    return run_ranks(w.worker, 2, str(compat_site), str(nvme), SCENARIOS, timeout=240)


@pytest.fixture(scope="module")
def ref():
    return w.reference()


def _close(got: dict, want: dict, what: str) -> None:
    assert sorted(got) == sorted(want), what
    for name, value in want.items():
        assert got[name].dtype == torch.float32, (what, name)
        where = f"{what} {name}"
        torch.testing.assert_close(got[name], value, **TOL, msg=lambda m, w=where: f"{w}: {m}")


@pytest.mark.multirank
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_full_values_equal_plain_adamw(runs, ref, name):
    for rank in range(2):
        out = runs[rank][name]
        _close(out["fp32"], ref["fp32"], f"rank {rank} fp32")
        for kind in ("exp_avg", "exp_avg_sq"):
            _close(out[kind], ref[kind], f"rank {rank} {kind}")
        _close(out["grad"], ref["grad"], f"rank {rank} grad")


@pytest.mark.multirank
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_set_reads_back_and_steps_like_the_reference(runs, ref, name):
    for rank in range(2):
        out = runs[rank][name]
        for n, (fp32, m, v, grad) in out["read_back"].items():
            assert torch.equal(fp32, w.modified(n, "param", out["fp32"][n]))
            assert torch.equal(m, w.modified(n, "exp_avg", out["exp_avg"][n]))
            assert torch.equal(v, w.modified(n, "exp_avg_sq", out["exp_avg_sq"][n]))
            torch.testing.assert_close(grad, w.modified(n, "grad", out["grad"][n]))
        # safe_update_full_grad_vectorized called update_func once per trainable param it
        # was given (not the frozen one), with the whole current gradient.
        assert out["vectorized_saw_current_grads"] == [True, True]
        _close(out["final"], ref["final"], f"rank {rank} fp32 after the edited step")
        # The model's weights took the edited masters' update at that step.
        _close(out["final_weights"], ref["final"], f"rank {rank} weights after the edited step")


@pytest.mark.multirank
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_gradients_only_between_backward_and_step_and_none_for_frozen(runs, name):
    for rank in range(2):
        out = runs[rank][name]
        assert out["grad_before_backward"] is None
        assert out["grad_after_step"] == [None, None, None]
        assert out["frozen"] == (None, None, None)
        assert "'exp_avg' not found" in out["state_before_step"]
        assert "first optimizer step" in out["state_before_step"]


@pytest.mark.multirank
@pytest.mark.parametrize("name", ["stage3", "stage3_nvme"])
def test_stage3_params_stay_partitioned_and_local_helpers_see_the_shard(runs, name):
    for rank in range(2):
        facts = runs[rank][name]["stage3"]
        assert facts["numel"] == [0, 0, 0]  # partitioned: param.data is empty
        if name == "stage3":  # with offload_param nvme the shards are in the swap store
            assert facts["ds_tensor_numel"] == [18, 11, 2]  # ceil(numel / 2): 35, 21, 3
        assert facts["full_shapes"] == [(7, 5), (3, 7), (3,)]
        assert facts["fp16_groups"] == [facts["trainable_ids"]]
        local, expected = facts["local_fp32"]
        valid = expected.numel()  # rank 1's last element of the 35 is padding
        assert local.shape == (18,) and torch.equal(local[:valid], expected)
        full = runs[rank][name]["fp32"]["0.weight"].reshape(-1)
        raised = full.clone()
        raised[:18] += 1.0
        raised[18:] += 1.0  # both ranks raised their shard
        assert torch.equal(facts["after_local_set"], raised)
        assert facts["restored"]
        assert "this rank's shard has 18" in facts["bad_numel"]
        for n, (got, want) in runs[rank][name]["local_grad"].items():
            torch.testing.assert_close(got, want, msg=lambda m, n=n: f"local grad {n}: {m}")


@pytest.mark.multirank
def test_local_helpers_refuse_params_below_stage3(runs):
    assert "only defined for ZeRO-3 partitioned parameters" in runs[0]["not_zero3"]


@pytest.mark.multirank
def test_bf16_helpers_return_the_fp32_masters_behind_the_weights(runs):
    for rank in range(2):
        facts = runs[rank]["bf16_stage3"]
        assert facts["dtypes"] == ["torch.float32"]
        assert facts["weights_are_rounded_masters"] and facts["masters_have_more_digits"]


@pytest.mark.multirank
def test_optimizer_backward_is_not_divided_by_accumulation_steps(runs):
    assert runs[0]["optimizer_backward_gas"] and runs[1]["optimizer_backward_gas"]

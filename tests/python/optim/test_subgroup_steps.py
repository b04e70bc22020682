"""DeepSpeedCPUAdam.step_subgroup / rollback_subgroup (DeepSpeed's speculative steps, Note
[Sub-group steps] in zerostream/ops/adam.py): a sub-group step is torch's AdamW step with
the state kept under the sub-group's id; a rollback returns the param and the moments to
their values before the step, to fp32 rounding."""

import pytest
import torch

from zerostream.ops.adam import DeepSpeedCPUAdam


def _param(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    p = torch.nn.Parameter(torch.randn(257, generator=g).to(dtype))
    p.grad = torch.randn(257, generator=g).to(dtype)
    return p


@pytest.mark.parametrize("adamw_mode", [True, False])
def test_a_subgroup_step_is_torchs_adam_step(adamw_mode):
    p = _param()
    ref = torch.nn.Parameter(p.detach().clone())
    ref.grad = p.grad.clone()
    cls = torch.optim.AdamW if adamw_mode else torch.optim.Adam
    torch_opt = cls([ref], lr=1e-2, weight_decay=0.1)
    opt = DeepSpeedCPUAdam([p], lr=1e-2, weight_decay=0.1, adamw_mode=adamw_mode)
    for _ in range(3):
        opt.step_subgroup(7)
        torch_opt.step()
    assert opt.state[7]["step"] == 3 and p not in opt.state  # keyed by the sub-group
    torch.testing.assert_close(p.detach(), ref.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(opt.state[7]["exp_avg"], torch_opt.state[ref]["exp_avg"])


@pytest.mark.parametrize("adamw_mode", [True, False])
def test_rollbacks_undo_the_steps_one_by_one(adamw_mode):
    p = _param(1)
    opt = DeepSpeedCPUAdam([p], lr=1e-2, weight_decay=0.05, adamw_mode=adamw_mode)
    history = []
    for _ in range(3):
        state = opt.state[0]
        history.append(
            (p.detach().clone(), *(state[k].clone() for k in ("exp_avg", "exp_avg_sq")))
            if state
            else (p.detach().clone(), None, None)
        )
        opt.step_subgroup(0)
    for step in (2, 1, 0):
        opt.rollback_subgroup(0)
        assert opt.state[0]["step"] == step
        before, m, v = history[step]
        torch.testing.assert_close(p.detach(), before, rtol=1e-5, atol=1e-6)
        if m is not None:
            torch.testing.assert_close(opt.state[0]["exp_avg"], m, rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(opt.state[0]["exp_avg_sq"], v, rtol=1e-4, atol=1e-7)
    assert opt.state[0]["exp_avg"].abs().max() < 1e-6  # back to the zeros it started from


def test_subgroups_keep_their_own_state_and_16bit_states_follow_the_flag():
    p = _param(2, torch.bfloat16)
    opt = DeepSpeedCPUAdam([p], fp32_optimizer_states=False)
    opt.step_subgroup(0)
    opt.step_subgroup(1)
    opt.step_subgroup(0)
    assert (opt.state[0]["step"], opt.state[1]["step"]) == (2, 1)
    assert opt.state[0]["exp_avg"].dtype == torch.bfloat16  # DeepSpeed: the param's dtype
    opt.rollback_subgroup(0)
    assert (opt.state[0]["step"], opt.state[1]["step"]) == (1, 1)


def test_rollbacks_without_a_step_are_refused():
    opt = DeepSpeedCPUAdam([_param()])
    # DeepSpeed's words, which its tests match.
    with pytest.raises(RuntimeError, match="Cannot rollback optimizer state for sub_group_id 0"):
        opt.rollback_subgroup(0)
    opt.step_subgroup(0)
    opt.rollback_subgroup(0)
    with pytest.raises(RuntimeError, match="Cannot rollback sub_group_id 0: step count is 0"):
        opt.rollback_subgroup(0)

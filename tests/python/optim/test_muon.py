"""optimizer.type "Muon" (DeepSpeed's MuonWithAuxAdam): matrices stepped by Muon, the rest by
AdamW, at ZeRO stages 0-3 on 1 and 2 Gloo ranks, against a single-process reference
written here from the published formulas (Keller Jordan's post: momentum, Nesterov, five
quintic Newton-Schulz steps with (3.4445, -4.7750, 2.0315), scale max(1, rows/cols)**0.5)
on the whole batch. That reference is itself checked against torch.optim.Muon, whose
Newton-Schulz runs in bf16 (hence its looser bound).

At 2 ranks the first weight straddles the stage 1/2 partition boundary and every matrix is
cut in two shards at stage 3, so a Muon that orthogonalised a partition's piece instead of
the whole matrix fails the comparison.
"""

from __future__ import annotations

import pytest
import torch

from multirank import run_ranks

STEPS, GLOBAL_BATCH, VOCAB = 4, 8, 10
LR, ADAM_LR, MOMENTUM, WD = 0.02, 0.01, 0.9, 0.05
A, B, C = 3.4445, -4.7750, 2.0315


class Net(torch.nn.Module):
    """An embedding (AdamW by DeepSpeed's name rule), a tall and a wide matrix (Muon) and
    biases (AdamW)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 8)
        self.a = torch.nn.Linear(8, 12)
        self.b = torch.nn.Linear(12, 6)

    def forward(self, x, y):
        h = self.b(torch.relu(self.a(self.embed(x))))
        return (h - y).pow(2).mean()


def _batches():
    g = torch.Generator().manual_seed(3)
    xs = torch.randint(0, VOCAB, (STEPS, GLOBAL_BATCH), generator=g)
    ys = torch.randn(STEPS, GLOBAL_BATCH, 6, generator=g)
    return xs, ys


def _config(micro, stage, clip, ns_method="standard", offload=False, reduce_bucket_size=40):
    zero = {"stage": stage, "reduce_bucket_size": reduce_bucket_size}
    if offload:  # the optimizer in host memory, and at stage 3 the param shards too
        zero["offload_optimizer"] = {"device": "cpu"}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": clip,
        "optimizer": {
            "type": "Muon",
            "params": {
                "lr": LR,
                "adam_lr": ADAM_LR,
                "momentum": MOMENTUM,
                "weight_decay": WD,
                "ns_method": ns_method,
            },
        },
        "zero_optimization": zero,
    }


# --- the reference: one process, the whole batch -------------------------------------------
def _ns5(g):
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (torch.linalg.matrix_norm(x) + 1e-7)
    for _ in range(5):
        s = x @ x.T
        x = A * x + (B * s + C * s @ s) @ x
    return (x.T if tall else x).float()


def _muon_update(grad, buf):
    buf.mul_(MOMENTUM).add_(grad, alpha=1 - MOMENTUM)
    nesterov = (1 - MOMENTUM) * grad + MOMENTUM * buf
    rows, cols = grad.shape
    return _ns5(nesterov) * max(1.0, rows / cols) ** 0.5


def reference_losses(clip):
    torch.manual_seed(0)
    net = Net()
    matrices = [net.a.weight, net.b.weight]
    others = [p for p in net.parameters() if all(p is not m for m in matrices)]
    adam = torch.optim.AdamW(others, lr=ADAM_LR, betas=(0.9, 0.95), eps=1e-10, weight_decay=WD)
    bufs = [torch.zeros_like(m) for m in matrices]
    xs, ys = _batches()
    losses = []
    for s in range(STEPS):
        net.zero_grad()
        loss = net(xs[s], ys[s])
        loss.backward()
        losses.append(float(loss.detach()))
        if clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        with torch.no_grad():
            for m, buf in zip(matrices, bufs):
                update = _muon_update(m.grad, buf)
                m.mul_(1 - LR * WD).sub_(LR * update)
        adam.step()
    return losses, {n: p.detach().clone() for n, p in net.named_parameters()}


def test_reference_matches_torch_muon():
    """The reference's Muon step against torch.optim.Muon (bf16 Newton-Schulz: ~1e-2)."""
    # requirements.txt pins a torch that has it: one without is an install fault, not a skip.
    assert hasattr(torch.optim, "Muon"), (
        f"torch {torch.__version__} has no torch.optim.Muon; scripts/setup.sh installs the "
        f"pinned torch (requirements.txt)"
    )
    g = torch.Generator().manual_seed(1)
    for shape in ((12, 8), (6, 12)):
        w = torch.randn(shape, generator=g)
        grads = [torch.randn(shape, generator=g) for _ in range(3)]
        p = torch.nn.Parameter(w.clone())
        opt = torch.optim.Muon([p], lr=LR, weight_decay=WD, momentum=MOMENTUM)
        ours, buf = w.clone(), torch.zeros(shape)
        for grad in grads:
            p.grad = grad.clone()
            opt.step()
            ours = ours * (1 - LR * WD) - LR * _muon_update(grad, buf)
        moved_torch, moved_ours = p.detach() - w, ours - w
        rel = (moved_torch - moved_ours).norm() / moved_ours.norm()
        assert rel < 3e-2, (shape, float(rel))


# --- zerostream on 1 and 2 ranks -------------------------------------------------------------
def worker(rank, world, cases):
    import torch.distributed as dist

    import zerostream
    from zerostream.zero import GatheredParameters

    torch.set_num_threads(1)
    xs, ys = _batches()
    micro = GLOBAL_BATCH // world
    out = {}
    for case in cases:
        torch.manual_seed(0)
        engine = zerostream.initialize(model=Net(), config=_config(micro, *case))[0]
        losses = []
        for s in range(STEPS):
            lo = rank * micro
            loss = engine(xs[s][lo : lo + micro], ys[s][lo : lo + micro])
            engine.backward(loss)
            engine.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append(float(total) / world)
        inner = engine.basic_optimizer
        flags = {n: p.use_muon for n, p in engine.module.named_parameters()}
        groups = [(g["use_muon"], g["lr"]) for g in inner.param_groups]
        momentum = sum(
            st["momentum_buffer"].numel() for st in inner.state.values() if "momentum_buffer" in st
        )
        with GatheredParameters(list(engine.module.parameters())):  # stage 3's are shards
            params = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
        out[case] = {
            "losses": losses,
            "params": params,
            "flags": flags,
            "groups": groups,
            "type": type(inner).__name__,
            "momentum_numel": momentum,
        }
        engine.destroy()
    return out


# (stage, gradient_clipping, ns_method, offload_optimizer cpu)
CASES = [
    (0, 0.0, "standard", False),
    (1, 0.0, "standard", False),
    (2, 0.0, "gram", False),
    (2, 0.3, "standard", False),
    (2, 0.0, "gram", True),
    (3, 0.3, "gram", False),
    (3, 0.0, "standard", True),
]


@pytest.mark.parametrize("world", [1, 2])
def test_muon_matches_single_process_reference(world):
    ranks = run_ranks(worker, world, CASES, timeout=240)
    refs = {clip: reference_losses(clip) for clip in {case[1] for case in CASES}}
    for out in ranks:
        for case in CASES:
            stage, clip = case[:2]
            run, (ref_losses, ref_params) = out[case], refs[clip]
            assert run["type"] == "MuonWithAuxAdam"
            assert run["flags"] == {
                "embed.weight": False,
                "a.weight": True,
                "a.bias": False,
                "b.weight": True,
                "b.bias": False,
            }
            assert run["groups"] == [(True, LR), (False, ADAM_LR)]
            assert run["losses"] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6), case
            for name, value in ref_params.items():
                torch.testing.assert_close(
                    run["params"][name], value, rtol=1e-4, atol=1e-5, msg=f"{case} {name}"
                )
            matrix_numel = 12 * 8 + 6 * 12
            if stage > 0 and world == 2:  # the momentum is partitioned, not whole per rank
                assert run["momentum_numel"] == matrix_numel // 2, case
            else:
                assert run["momentum_numel"] == matrix_numel, case
    # the clip changed the math (the comparison above would not notice a dropped clip)
    assert refs[0.3][0] != pytest.approx(refs[0.0][0], rel=1e-4)


def test_partition_slice_orthogonalisation_would_fail():
    """The comparison can fail: orthogonalising the halves of a split matrix separately is
    far from orthogonalising it whole (what a partition-local Muon would do)."""
    g = torch.Generator().manual_seed(5)
    m = torch.randn(12, 8, generator=g)
    whole = _ns5(m).reshape(-1)
    flat = m.reshape(-1)
    halves = torch.cat(
        [_ns5(flat[:48].view(6, 8)).reshape(-1), _ns5(flat[48:].view(6, 8)).reshape(-1)]
    )
    assert (halves - whole).norm() / whole.norm() > 0.3


# --- refusals and options --------------------------------------------------------------------
def _cfg(extra_params=None, **zero):
    from zerostream.config import load

    tree = _config(1, zero.pop("stage", 2), 0.0)
    tree["zero_optimization"].update(zero)
    tree["optimizer"]["params"].update(extra_params or {})
    return load(tree)


def test_refusals_name_the_setting():
    from zerostream.optim_factory import muon_groups

    groups = [{"params": list(Net().parameters())}]
    with pytest.raises(NotImplementedError, match='offload_optimizer.device "nvme"'):
        cfg = _cfg(offload_optimizer={"device": "nvme", "nvme_path": "/tmp"})
        muon_groups(None, cfg, Net(), groups)
    with pytest.raises(ValueError, match="optimizer.params.adjust_lr_fn"):
        muon_groups(None, _cfg({"adjust_lr_fn": "original"}), Net(), groups)


def test_option_checks_and_group_split():
    from zerostream.ops.muon import MuonWithAuxAdam, config_groups

    net = Net()
    with pytest.raises(ValueError, match="optimizer.params.ns_method"):
        config_groups([{"params": list(net.parameters())}], {"ns_method": "svd"})
    with pytest.raises(ValueError, match="optimizer.params.momentum"):
        config_groups([{"params": list(net.parameters())}], {"momentum": 1.0})
    with pytest.raises(ValueError, match="use_muon"):
        MuonWithAuxAdam([{"params": [net.a.weight]}])
    net.a.bias.use_muon = True
    with pytest.raises(ValueError, match="not a matrix"):
        config_groups([{"params": list(net.parameters())}], {})
    # muon_lr / adam_lr override lr for their side (DeepSpeed's engine); defaults otherwise
    del net.a.bias.use_muon
    split = config_groups([{"params": list(net.parameters())}], {"lr": 0.1, "muon_lr": 0.3})
    opt = MuonWithAuxAdam(split)
    muon, adam = opt.param_groups
    assert (muon["lr"], muon["momentum"], muon["ns_method"]) == (0.3, 0.95, "gram")
    assert (adam["lr"], adam["betas"], adam["eps"]) == (0.1, (0.9, 0.95), 1e-10)


# --- checkpoint resume and gradient accumulation -------------------------------------------
def resume_worker(rank, world, root):
    import torch.distributed as dist

    import zerostream

    torch.set_num_threads(1)
    xs, ys = _batches()
    micro = GLOBAL_BATCH // world // 2  # two micro-batches per step

    def make(stage):
        torch.manual_seed(0)
        cfg = _config(micro, stage, 0.0)
        cfg["gradient_accumulation_steps"] = 2
        return zerostream.initialize(model=Net(), config=cfg)[0]

    def train(engine, steps):
        losses = []
        for s in steps:
            total = 0.0
            for m in range(2):
                lo = (m * world + rank) * micro
                loss = engine(xs[s][lo : lo + micro], ys[s][lo : lo + micro])
                engine.backward(loss)
                engine.step()
                t = loss.detach().clone()
                dist.all_reduce(t)
                total += float(t) / world / 2
            losses.append(total)
        return losses

    out = {}
    for stage in (2, 3):
        engine = make(stage)
        first = train(engine, range(2))
        engine.save_checkpoint(root, tag=f"s{stage}")
        straight = train(engine, range(2, STEPS))
        engine.destroy()
        engine = make(stage)
        engine.load_checkpoint(root, tag=f"s{stage}")
        resumed = train(engine, range(2, STEPS))
        engine.destroy()
        out[stage] = (first + straight, resumed)
    return out


def test_checkpoint_resume_and_accumulation(tmp_path):
    """Stages 2 and 3 on 2 ranks with two micro-batches a step equal the reference (the mean
    over the micro-batches is the whole batch's gradient), and a run resumed from a
    checkpoint (momentum and AdamW moments restored) continues bitwise."""
    ranks = run_ranks(resume_worker, 2, str(tmp_path), timeout=300)
    ref_losses, _ = reference_losses(0.0)
    for out in ranks:
        for stage, (losses, resumed) in out.items():
            assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6), stage
            assert resumed == losses[2:], stage


def client_worker(rank, world):
    import zerostream
    from zerostream.ops.muon import MuonWithAuxAdam

    torch.manual_seed(0)
    net = Net()
    # a vector in the Muon group (the last param of the group: on rank 1's partition only)
    groups = [
        {"params": [net.a.weight, net.b.weight, net.b.bias], "use_muon": True},
        {"params": [net.embed.weight, net.a.bias], "use_muon": False},
    ]
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
    try:
        zerostream.initialize(model=net, optimizer=MuonWithAuxAdam(groups), config=cfg)
    except ValueError as exc:
        return str(exc)
    return None


def test_client_muon_with_a_vector_is_refused_on_every_rank():
    for message in run_ranks(client_worker, 2, timeout=120):
        assert message is not None and "shape (6,), not a matrix" in message

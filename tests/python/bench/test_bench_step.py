"""`zerostream bench step` on CPU: the report is complete and its peers train the same model on
the same data (so their numbers compare like with like). No timing is asserted."""

import json
import os

import pytest

from zerostream.bench import step
from zerostream.bench.gpt import GPT, SIZES


def _run(capsys, *flags):
    rc = step.main(["--size", "tiny", "--steps", "2", "--warmup", "1", "--json", *flags])
    return rc, json.loads(capsys.readouterr().out)


def test_gpt_parameter_count_matches_its_formula():
    for name in ("tiny", "small"):
        shape = SIZES[name]
        assert sum(p.numel() for p in GPT(shape).parameters()) == shape.params


@pytest.mark.slow  # a benchmark's own run: the slow tier
@pytest.mark.timeout(600)
def test_peers_train_the_same_model_on_the_same_data(capsys):
    rc, res = _run(
        capsys,
        "--stage",
        "2",
        "--offload-optimizer",
        "cpu",
        "--peers",
        "zerostream,no-offload,torch,deepspeed",
    )
    assert rc == 0
    peers = res["peers"]
    ours, plain = peers["zerostream"], peers["torch"]
    assert "median_step_seconds" in ours, ours
    # Same seed and data: the same first loss everywhere; AdamW with the same settings and
    # clipping keeps fp32 trajectories together (CPU Adam vs torch's fused AdamW: ~1e-6).
    for name in ("no-offload", "torch"):
        assert peers[name]["losses"] == pytest.approx(ours["losses"], rel=1e-4), name
    assert ours["losses"][0] == plain["losses"][0]
    assert ours["tokens_per_second"] == pytest.approx(
        4 * SIZES["tiny"].seq / ours["median_step_seconds"]
    )
    assert {"forward", "backward", "step"} <= set(ours["phase_seconds"])
    assert ours["peak_rss_bytes"] > 0 and ours["peak_device_bytes"] is None  # CPU run
    assert "deepspeed" in peers and (
        "skipped" in peers["deepspeed"] or "losses" in peers["deepspeed"]
    )
    ratios = res["ratios"]
    assert {"no-offload_over_zerostream", "torch_over_zerostream", "bound_seconds"} <= set(ratios)
    assert res["config"]["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    # The CPU optimizer's kernel ran inside the step: on this host run (no copy stage) its
    # bound is the kernel's own time, which the step (norm, kernel, checks) exceeds.
    update = ours["phase_seconds"]["cpu_update"]
    assert 0 < update < ours["phase_seconds"]["step"]
    assert ratios["step_bound_seconds"] == pytest.approx(update)
    assert ratios["step_over_its_bound"] == pytest.approx(ours["phase_seconds"]["step"] / update)
    assert ratios["step_over_its_bound"] > 1


def test_the_step_bound_is_the_slower_of_the_cpu_update_and_its_uploads():
    from zerostream.bench.step import _step_pipeline

    res = {"phase_seconds": {"step": 0.5, "cpu_update": 0.3}, "tier_seconds": {"h2d": 0.4}}
    res["tier_seconds"]["d2h"] = 0.9  # the gradients' downloads ran in backward: not a bound
    assert _step_pipeline(res, False) == {
        "step_bound_seconds": 0.4,
        "step_over_its_bound": pytest.approx(1.25),
    }
    assert _step_pipeline(res, True) == {}  # gathers' uploads share the lane's seconds
    assert _step_pipeline({"phase_seconds": {"step": 0.5}}, False) == {}  # no CPU optimizer


@pytest.mark.slow  # a benchmark's own run: the slow tier
@pytest.mark.timeout(600)
def test_nvme_offload_reports_the_bytes_it_moved(capsys, tmp_path):
    rc, res = _run(
        capsys,
        "--stage",
        "1",
        "--offload-optimizer",
        "nvme",
        "--nvme-path",
        str(tmp_path),
        "--peers",
        "zerostream,no-offload",
    )
    assert rc == 0
    ours = res["peers"]["zerostream"]
    padded = res["params"] + res["params"] % 2  # one rank: the flat group padded to 2 * world
    for link in ("nvme_read", "nvme_write"):  # fp32 param, exp_avg, exp_avg_sq per element
        assert ours["links"][link]["bytes_per_step"] == 12 * padded, link
    assert res["peers"]["no-offload"]["losses"] == pytest.approx(ours["losses"], rel=1e-4)
    # The bytes above went through the swap store's files under tmp_path; they are scratch,
    # deleted with the job's lock and the directories the store made when the peer's
    # process ends (reliability items 1 and 3).
    assert not (tmp_path / "zerostream").exists()
    assert not any(tmp_path.rglob("*.bin")) and not any(tmp_path.rglob(".lock"))


@pytest.mark.slow  # CI's 25 minutes
def test_a_config_without_offload_skips_the_no_offload_peer(capsys):
    rc, res = _run(capsys, "--stage", "0", "--peers", "zerostream,no-offload")
    assert rc == 0 and res["peers"]["no-offload"] == {
        "peer": "no-offload",
        "skipped": "the config offloads nothing",
    }


@pytest.mark.timeout(600)
def test_the_serial_step_peer_is_the_same_run_without_the_overlap(capsys):
    """--overlap-step sets zerostream.overlap_step; the serial-step peer runs the same config
    without it: the same losses bit for bit, the update timed behind the forward, and no
    step-bound ratios (the update is not inside step() there)."""
    flags = ["--stage", "3", "--offload-optimizer", "cpu", "--overlap-step"]
    rc, res = _run(capsys, *flags, "--peers", "zerostream,serial-step")
    assert rc == 0
    assert res["config"]["zerostream"]["overlap_step"] == "next_forward"
    ours, serial = res["peers"]["zerostream"], res["peers"]["serial-step"]
    assert ours["losses"] == serial["losses"]
    assert ours["phase_seconds"]["update_behind"] > 0, ours["phase_seconds"]
    assert "update_behind" not in serial["phase_seconds"], serial["phase_seconds"]
    assert set(res["ratios"]) == {"serial-step_over_zerostream"}, res["ratios"]
    rc, res = _run(capsys, "--stage", "3", "--offload-optimizer", "cpu", "--peers", "serial-step")
    assert res["peers"]["serial-step"] == {
        "peer": "serial-step",
        "skipped": "the config has no overlap_step",
    }


@pytest.mark.timeout(600)
def test_the_step_started_during_the_backward_is_benched_against_the_serial_step(capsys):
    """--overlap-step backward: the update starts during the backward (the speculation's
    own time is reported) and the losses are the serial step's bit for bit."""
    flags = ["--stage", "3", "--offload-optimizer", "cpu", "--overlap-step", "backward"]
    rc, res = _run(capsys, *flags, "--peers", "zerostream,serial-step", "--steps", "2")
    assert rc == 0 and res["config"]["zerostream"]["overlap_step"] == "backward"
    ours, serial = res["peers"]["zerostream"], res["peers"]["serial-step"]
    assert ours["losses"] == serial["losses"]
    assert ours["phase_seconds"]["speculate"] > 0, ours["phase_seconds"]


def test_a_device_share_is_set_from_its_flag(capsys):
    """--optimizer-max-on-device sets zerostream.optimizer_max_on_device (a count or "auto")
    and the run takes it: on this host run, where the device's memory is the host's, "auto"
    moves nothing and the step runs as without it."""
    flags = ["--stage", "2", "--offload-optimizer", "cpu", "--optimizer-max-on-device"]
    rc, res = _run(capsys, *flags, "auto", "--peers", "zerostream")
    assert rc == 0 and res["config"]["zerostream"]["optimizer_max_on_device"] == "auto"
    assert "median_step_seconds" in res["peers"]["zerostream"], res["peers"]["zerostream"]
    rc, res = _run(capsys, *flags, "1000", "--peers", "zerostream")
    assert rc == 0 and res["config"]["zerostream"]["optimizer_max_on_device"] == 1000


def test_unknown_peers_are_named():
    with pytest.raises(ValueError, match=r"--peers: unknown \['fastest'\]"):
        step.main(["--peers", "zerostream,fastest"])


def test_deepspeed_shm_segments_of_a_finished_peer_are_removed():
    """DeepSpeed's CPU all-reduce leaves a 69 MB /dev/shm segment per rank; the bench removes
    the ones of its own peer's rendezvous (address and port) and nothing else."""
    from zerostream.bench import remove_deepspeed_shm

    uid = os.getuid()
    ours = [f"/dev/shm/deepspeed_allreduce_buffer_{uid}_127.0.0.9_40001_{r}" for r in (0, 1)]
    others = [
        f"/dev/shm/deepspeed_allreduce_buffer_{uid}_127.0.0.9_400010_0",  # another port
        f"/dev/shm/deepspeed_allreduce_buffer_{uid}_127.0.0.9_40001_x",  # not a rank
        "/dev/shm/zs_unrelated_127.0.0.9_40001_0",
    ]
    for path in ours + others:
        with open(path, "wb") as f:
            f.write(b"x")
    try:
        assert remove_deepspeed_shm("127.0.0.9", 40001) == 2
        assert not any(os.path.exists(p) for p in ours)
        assert all(os.path.exists(p) for p in others)
    finally:
        for path in ours + others:
            if os.path.exists(path):
                os.unlink(path)

"""The main job (examples/train_gpt.py) as demo.sh runs it, shortened: 2 ranks launched by
`zerostream run`, stage 3 with parameters and optimizer states on NVMe. Checks that it learns
(held-out loss falls), that the offloaded state really was on disk, that the checkpoint is in
DeepSpeed's layout, and that a run resumed in new processes continues the saved one exactly:
its losses are those of one uninterrupted run of the same length. The resumed run is given
only --save-dir: it goes on from that folder's latest save by itself, as a run restarted by
`zerostream run --max_restarts` does (README "Several machines")."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "zero3_offload_nvme.json"


def _train(tmp: pathlib.Path, name: str, steps: int, *extra: str) -> dict:
    out = tmp / name
    cmd = [
        sys.executable, "-m", "zerostream.cli", "run", "--nproc", "2",
        str(REPO / "examples" / "train_gpt.py"),
        "--deepspeed_config", str(CONFIG), "--nvme-path", str(tmp / f"nvme-{name}"),
        "--size", "tiny", "--lr", "3e-3", "--steps", str(steps),
        "--eval-every", "8", "--eval-batches", "2", "--corpus-mb", "2",
        "--out", str(out), *extra,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if env.get("PYTHONPATH"):  # the developer loop's relative "python" must survive cwd=tmp
        env["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep)
        )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads((out / "summary.json").read_text())
    summary["stdout"] = proc.stdout
    return summary


@pytest.mark.timeout(600)
def test_main_job_learns_offloads_to_disk_and_resumes_exactly(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    # 24 steps, saved after 16 (the save must change nothing: test_resume.py compares an
    # interrupted run with an uninterrupted one at the engine level); then 8 steps resumed.
    first = _train(tmp_path, "first", 24, "--save-dir", ckpt, "--save-at", "16")
    resumed = _train(tmp_path, "resumed", 8, "--save-dir", ckpt)

    # It learns: held-out loss well below the untrained model's (ln 256 = 5.55 for bytes).
    v0, v1 = first["validation_loss"]
    assert v0 > 5.0 and v1 < 0.8 * v0, first["validation_loss"]

    # The offloaded state was on the disk: allocated swap-file bytes and NVMe traffic for
    # both the parameters and the optimizer.
    swap = first["swap_files"]
    (disk,) = swap["paths"].values()
    assert disk["files"] >= 2 and disk["allocated_bytes"] >= swap["state_bytes"] > 0, swap
    for tier in ("nvme_read", "nvme_write", "param_nvme_read", "param_nvme_write"):
        assert first["tiers"][tier]["gb"] > 0, (tier, first["tiers"])

    # DeepSpeed's checkpoint layout, rank-0 model file per rank and bf16 optimizer files.
    step_dir = pathlib.Path(ckpt) / "global_step16"
    for r in (0, 1):
        assert (step_dir / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt").is_file()
        assert (step_dir / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt").is_file()

    # Resumed in new processes, it continues the saved run exactly: the same losses and the
    # same held-out loss at step 16 (measured before the save) and at the end.
    assert "resumed from" in resumed["stdout"] and resumed["steps"] == [16, 24]
    at_16 = dict(map(tuple, first["history"]["eval"]))[16]
    assert resumed["validation_loss"][0] == at_16
    assert resumed["history"]["loss"] == first["history"]["loss"][16:]
    assert resumed["validation_loss"][1] == first["validation_loss"][1]
    assert (pathlib.Path(ckpt) / "latest").read_text().strip() == "global_step24"

    # The report: a PNG plot whose path is printed, and the summary table.
    png = first["stdout"].split("plot: ")[-1].split()[0]
    assert pathlib.Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for row in ("train loss", "validation loss", "time by phase", "peak RSS", "swap files"):
        assert row in first["stdout"], row


def _demo_verdict(out: pathlib.Path, v, r, state_bytes=831488):
    """Runs the verdict scripts/demo.sh prints at its end over run1/run2 summaries."""
    text = (REPO / "scripts" / "demo.sh").read_text()
    script = text.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    swap = {"paths": {"/tmp/x": {"files": 10, "allocated_bytes": 469770240}}}
    for name, losses in (("run1", v), ("run2", r)):
        (out / name).mkdir(parents=True, exist_ok=True)
        summary = {"validation_loss": losses, "swap_files": {**swap, "state_bytes": state_bytes}}
        (out / name / "summary.json").write_text(json.dumps(summary))
    return subprocess.run(
        [sys.executable, "-", str(out)], input=script, capture_output=True, text=True, timeout=60
    )


def test_the_demos_verdict_passes_a_good_run_and_names_a_bad_one(tmp_path):
    """The check at the end of scripts/demo.sh (its own Python), on the summaries of a run
    that learned and resumed exactly, and of runs that did not (it once failed on every run:
    a name used before it was assigned)."""
    good = _demo_verdict(tmp_path / "good", [5.418, 2.402], [2.402, 2.364])
    assert good.returncode == 0, good.stderr
    assert "validation loss 5.418 -> 2.402; resumed at 2.402" in good.stdout
    assert "0.79 MiB of state in 448.0 MiB of swap files" in good.stdout
    for name, v, r, state, why in (
        ("flat", [5.4, 5.0], [5.0, 4.9], 831488, "5.400 -> 5.000 did not fall below 75%"),
        ("jump", [5.4, 2.4], [2.6, 2.5], 831488, "started at 2.600, not where the saved"),
        ("rise", [5.4, 2.4], [2.4, 2.6], 831488, "validation loss rose, 2.400 -> 2.600"),
        ("empty", [5.4, 2.4], [2.4, 2.3], 0, "the swap files held no state"),
    ):
        bad = _demo_verdict(tmp_path / name, v, r, state)
        assert bad.returncode != 0 and bad.stderr.startswith("demo: "), (name, bad)
        assert why in bad.stderr and bad.stderr.count(";") == 0, (name, bad.stderr)

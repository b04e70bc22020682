"""Restarts that resume (issue 32 item 2): `zerostream run --max_restarts 2` restarts the
ranks after one is SIGKILLed in the middle of a step, and again after one dies in the middle
of a checkpoint save; each time the restarted ranks resume from the newest complete
checkpoint (restart_train.py's one-line pattern), and each step done again computes exactly
what the attempt that was cut short computed (test_resume.py compares a resumed run with an
uninterrupted one at the engine level). The partial save is never loaded and is gone at the end.
Without --max_restarts the first kill ends the job."""

import json
import pathlib

import pytest
from launcher_run import launch

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = str(HERE / "restart_train.py")


def _run(tmp_path: pathlib.Path, kill: str, restarts: int):
    out = tmp_path / kill
    out.mkdir()
    args = ["--nproc", "2", "--no_local_rank", f"--max_restarts={restarts}", SCRIPT]
    done = launch([*args, str(out), kill], out)
    records = [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]
    return done, records, out


@pytest.mark.multirank
def test_a_rank_killed_mid_step_then_mid_save_restarts_and_resumes_exactly(tmp_path):
    done, records, out = _run(tmp_path, "both", 2)
    assert done.returncode == 0, done.stderr[-3000:]
    # Attempt 0 died in step 2, attempt 1 in the save after step 4; each step that was cut
    # short was done again by the next attempt, from the newest complete checkpoint.
    assert [(r["step"], r["attempt"]) for r in records] == [
        (0, 0),
        (1, 0),
        (2, 0),
        (2, 1),
        (3, 1),
        (4, 1),
        (4, 2),
        (5, 2),
    ], records
    # Redone from a checkpoint, a step computes exactly what the uninterrupted attempt did
    # (step 2 resumed from the save after step 1; step 4 from the one after step 3: the
    # half-written save after step 4 was not loaded).
    for step in (2, 4):
        first, again = (r["loss"] for r in records if r["step"] == step)
        assert first == again, (step, records)
    ckpt = sorted(p.name for p in (out / "ckpt").iterdir())
    assert not [n for n in ckpt if n.endswith(".partial")], ckpt  # no half save remains
    assert (out / "ckpt" / "latest").read_text() == "global_step6"


@pytest.mark.slow  # a failing rank ending the job is test_run_launch's default-tier case
def test_without_max_restarts_the_kill_ends_the_job(tmp_path):
    done, records, _ = _run(tmp_path, "both", 0)
    assert done.returncode != 0
    assert "rank 1" in done.stderr and {r["attempt"] for r in records} == {0}
    assert max(r["step"] for r in records) == 2  # ended in step 2

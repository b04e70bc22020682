"""scripts/deepspeed_unit.py, the runner of DeepSpeed's own unit tests on the package: its
reading of pytest's junit XML and its classes, on a hand-made report (the run itself needs
a DeepSpeed checkout and about two hours: scripts/deepspeed-unit.sh)."""

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "scripts"))
import deepspeed_unit  # noqa: E402

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="" name="unit.runtime.zero.test_zero_tiled">
  <error message="collection failure">ModuleNotFoundError: No module named
    'deepspeed.runtime.zero.tiling'</error>
</testcase>
<testcase classname="unit.v1.zero.test_zero.TestA" name="test[1]"/>
<testcase classname="unit.v1.zero.test_zero.TestA" name="test[2]"/>
<testcase classname="unit.v1.zero.test_zero.TestB" name="test">
  <skipped message="fp16 is not supported"/>
</testcase>
<testcase classname="unit.v1.zero.test_zero.TestC" name="test">
  <failure message="AttributeError"
    >'PartitionedOptimizer' object has no attribute 'nccl_start_alignment_factor'</failure>
</testcase>
<testcase classname="unit.v1.zero.test_offload_states.TestD" name="test">
  <failure message="AssertionError: FAIL: Allocated memory should decrease after offload"/>
</testcase>
<testcase classname="unit.v1.zero.test_zero.TestE" name="test">
  <failure message="boom">E   RuntimeError: the package got it wrong</failure>
</testcase>
</testsuite></testsuites>
"""


def test_classes_and_pass_rate(tmp_path, capsys):
    xml = tmp_path / "r.xml"
    xml.write_text(REPORT)
    cases = deepspeed_unit.outcomes([xml])
    deepspeed_unit.classify(cases)
    summary = deepspeed_unit.report(cases, 0.0)
    assert [c["class"] for c in cases] == [
        "internal", "passed", "passed", "skipped", "internal", "cuda", "failed",
    ]  # fmt: skip
    assert cases[-1]["cause"] == "unexplained: E   RuntimeError: the package got it wrong"
    # Only the tests that exercise the public API and can pass on a CPU are counted.
    assert summary["pass_rate"] == round(2 / 3, 4)
    assert "pass rate (public API, CPU): 2/3" in capsys.readouterr().out


RERUN = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="unit.runtime.zero.test_zero_tiled.TestF" name="test"/>
<testcase classname="unit.v1.zero.test_zero.TestE" name="test"/>
</testsuite></testsuites>
"""


def test_a_later_report_replaces_the_records_it_reruns(tmp_path):
    """--xml first.xml rerun.xml: the rerun's records win, and a module that failed to
    import and now runs loses its import-failure record."""
    first, rerun = tmp_path / "first.xml", tmp_path / "rerun.xml"
    first.write_text(REPORT)
    rerun.write_text(RERUN)
    cases = deepspeed_unit.outcomes([first, rerun])
    by_id = {c["id"]: c["outcome"] for c in cases}
    assert "::unit.runtime.zero.test_zero_tiled" not in by_id
    assert by_id["unit.v1.zero.test_zero.TestE::test"] == "passed"  # was failed
    assert by_id["unit.runtime.zero.test_zero_tiled.TestF::test"] == "passed"
    assert len(cases) == 7  # 7 records in the first report, one dropped, one added


def test_the_runner_refuses_a_folder_that_is_not_a_deepspeed_checkout(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "deepspeed_unit.py"), str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "is not a DeepSpeed checkout" in done.stderr

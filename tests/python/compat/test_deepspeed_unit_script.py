"""scripts/deepspeed_unit.py, the runner of DeepSpeed's own unit tests on a `deepspeed`
package: its reading of pytest's junit XML and its classes, the files in scope, and the
count against DeepSpeed itself, on hand-made reports (the runs themselves need a DeepSpeed
checkout and hours: scripts/deepspeed-unit.sh)."""

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "scripts"))
import deepspeed_unit  # noqa: E402
import deepspeed_unit_scope  # noqa: E402
from deepspeed_unit_compare import compare, markdown_table, per_file  # noqa: E402

from prerequisites import missing  # noqa: E402

CHECKOUT = REPO.parent / "shared" / "deepspeed"  # beside the repository, as conftest.SHARED

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


def test_classes(tmp_path, capsys):
    xml = tmp_path / "r.xml"
    xml.write_text(REPORT)
    cases = deepspeed_unit.outcomes([xml])
    deepspeed_unit.classify(cases)
    summary = deepspeed_unit.report(cases, 0.0)
    assert [c["class"] for c in cases] == [
        "internal", "passed", "passed", "skipped", "internal", "cuda", "failed",
    ]  # fmt: skip
    assert cases[-1]["cause"] == "unexplained: E   RuntimeError: the package got it wrong"
    assert (summary["passed"], summary["failed"], summary["internal"]) == (2, 1, 2)
    # One run gives no rate: the classes explain, DeepSpeed's own run is the denominator.
    assert "pass_rate" not in summary and "--compare" in capsys.readouterr().out


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


def _case(ident, outcome, klass=None, cause=""):
    return {"id": ident, "outcome": outcome, "class": klass or outcome, "cause": cause}


def test_the_count_is_what_deepspeed_itself_passes():
    """Denominator: the tests DeepSpeed passes. A test zerostream's classes call "cuda" or
    "internal" stays in it when DeepSpeed passes it; one DeepSpeed fails or skips is out
    whatever zerostream does; a module zerostream cannot import loses all its tests."""
    peer = {"package": "deepspeed", "package_version": "0.19.8", "cases": [
        _case("unit.a.test_x.TestA::test[1]", "passed"),
        _case("unit.a.test_x.TestA::test[2]", "passed"),  # zerostream: internal
        _case("unit.a.test_x.TestA::test[3]", "passed"),  # zerostream: cuda
        _case("unit.a.test_x.TestB::test", "failed"),  # DeepSpeed fails it: out
        _case("unit.a.test_x.TestC::test", "skipped"),  # out
        _case("unit.b.test_y.TestD::test[1]", "passed"),  # zerostream: import error
        _case("unit.b.test_y::test_free", "passed"),  # zerostream: import error
        _case("unit.c.test_z::test_free", "passed"),  # zerostream did not run it
    ]}  # fmt: skip
    ours = {"package": "zerostream", "package_version": "0.19.8+zerostream.0.1.0", "cases": [
        _case("unit.a.test_x.TestA::test[1]", "passed"),
        _case("unit.a.test_x.TestA::test[2]", "failed", "internal", "reads _x"),
        _case("unit.a.test_x.TestA::test[3]", "failed", "cuda", "DDP device_ids"),
        _case("unit.a.test_x.TestB::test", "passed"),
        _case("unit.a.test_x.TestC::test", "passed"),
        _case("::unit.b.test_y", "failed", "failed", "unexplained: ImportError: no name"),
    ]}  # fmt: skip
    result = compare(peer, ours)
    assert result["deepspeed_passed"] == 6
    assert result["zerostream_passed_of_those"] == 1
    assert result["rate"] == round(1 / 6, 4)
    lost = {
        c["id"]: (c["class"], c["cause"]) for c in result["deepspeed_passes_zerostream_does_not"]
    }
    assert lost["unit.a.test_x.TestA::test[2]"] == ("internal", "reads _x")
    assert lost["unit.a.test_x.TestA::test[3]"] == ("cuda", "DDP device_ids")
    assert lost["unit.b.test_y.TestD::test[1]"][1] == "unexplained: ImportError: no name"
    assert lost["unit.b.test_y::test_free"][1] == "unexplained: ImportError: no name"
    assert lost["unit.c.test_z::test_free"][0] == "not run"
    assert len(lost) == 5
    assert result["zerostream_passes_deepspeed_does_not"] == [
        "unit.a.test_x.TestB::test", "unit.a.test_x.TestC::test",
    ]  # fmt: skip


def test_the_per_file_table_counts_each_file_on_both_sides():
    """The per-file rows (docs/compat.md's table): what each package ran, passed and skipped,
    passed by both, by DeepSpeed only and by zerostream only; a module zerostream cannot
    import loses its tests in its own row; the totals are the sums."""
    peer = {"package": "deepspeed", "cases": [
        _case("unit.a.test_x.TestA::test[1]", "passed"),
        _case("unit.a.test_x.TestA::test[2]", "passed"),
        _case("unit.a.test_x::test_free", "skipped"),
        _case("unit.b.test_y.TestD::test", "passed"),
        _case("unit.c.test_z::test", "failed"),
    ]}  # fmt: skip
    ours = {"package": "zerostream", "cases": [
        _case("unit.a.test_x.TestA::test[1]", "passed"),
        _case("unit.a.test_x.TestA::test[2]", "failed", "internal", "reads _x"),
        _case("unit.a.test_x::test_free", "skipped"),
        _case("::unit.b.test_y", "failed", "failed", "ImportError"),
        _case("unit.c.test_z::test", "passed"),
    ]}  # fmt: skip
    rows = {r["file"]: r for r in per_file(peer, ours, compare(peer, ours))}
    assert set(rows) == {"unit/a/test_x.py", "unit/b/test_y.py", "unit/c/test_z.py"}
    a, b, c = rows["unit/a/test_x.py"], rows["unit/b/test_y.py"], rows["unit/c/test_z.py"]
    assert (a["ds_ran"], a["ds_passed"], a["ds_skipped"]) == (3, 2, 1)
    assert (a["zs_passed"], a["zs_skipped"], a["both"], a["ds_only"], a["zs_only"]) == (
        1, 1, 1, 1, 0)  # fmt: skip
    assert (b["ds_passed"], b["zs_passed"], b["ds_only"], b["both"]) == (1, 0, 1, 0)
    assert (c["ds_passed"], c["zs_passed"], c["zs_only"]) == (0, 1, 1)
    table = markdown_table(list(rows.values()))
    assert "| `unit/a/test_x.py` | 3 | 2 | 1 | 1 | 1 | 1 | 1 | 0 |" in table
    assert (
        table.splitlines()[-1]
        == "| **3 files** | **5** | **3** | **1** | **2** | **1** | **1** | **2** | **1** |"
    )


def test_compare_reads_both_json_files_and_refuses_them_swapped(tmp_path):
    peer = {"package": "deepspeed", "package_version": "0.19.8",
            "cases": [_case("unit.a.test_x::test", "passed")]}  # fmt: skip
    ours = {"package": "zerostream", "package_version": "z", "cases": []}
    (tmp_path / "p.json").write_text(json.dumps(peer))
    (tmp_path / "o.json").write_text(json.dumps(ours))
    script = [sys.executable, str(REPO / "scripts" / "deepspeed_unit.py"), "--compare"]
    out = tmp_path / "c.json"
    done = subprocess.run([*script, str(tmp_path / "p.json"), str(tmp_path / "o.json"),
                           "--json", str(out)], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "zerostream passes 0 of those 1" in done.stdout
    assert json.loads(out.read_text())["deepspeed_passed"] == 1
    swapped = subprocess.run([*script, str(tmp_path / "o.json"), str(tmp_path / "p.json")],
                             capture_output=True, text=True)  # fmt: skip
    assert swapped.returncode != 0 and "DeepSpeed's JSON first" in swapped.stderr


def test_scope_is_every_file_but_the_refused_features(tmp_path):
    tests = tmp_path / "tests"
    for path in ["unit/pipe/test_pipe_module.py", "unit/runtime/test_pld.py",
                 "unit/runtime/test_new_feature.py", "unit/v1/zero/test_offload_states.py",
                 "unit/v1/zero/test_zero.py", "unit/v1/zero/helper.py",
                 "unit/runtime/zero/test_zeropp.py"]:  # fmt: skip
        (tests / path).parent.mkdir(parents=True, exist_ok=True)
        (tests / path).write_text("")
    # A new file is in unless it is refused by name; test_offload_states runs last.
    assert deepspeed_unit_scope.in_scope_files(tests) == [
        "unit/runtime/test_new_feature.py", "unit/v1/zero/test_zero.py",
        "unit/v1/zero/test_offload_states.py",
    ]  # fmt: skip
    assert deepspeed_unit_scope.out_of_scope("unit/runtime/test_pld.py") == "progressive layer drop"


def test_every_out_of_scope_entry_names_a_file_of_the_checkout():
    if not (CHECKOUT / "tests" / "unit" / "common.py").is_file():
        missing(f"no DeepSpeed checkout at {CHECKOUT} (its tests/ folder)")
    assert deepspeed_unit_scope.stale_entries(CHECKOUT / "tests") == []
    assert all(why for _, why in deepspeed_unit_scope.OUT_OF_SCOPE)


HANGING = """
import pytest


def test_first():
    pass


@pytest.mark.parametrize("n", [1, 2])
class TestHangs:
    def test_it(self, n):
        if n == 1:  # what DeepSpeed's harness does when a test's ranks are not done in time
            pytest.exit("Test hanged, exiting", returncode=1)


def test_last():
    pass
"""


def test_a_hung_test_is_recorded_and_the_rest_of_the_files_still_run(tmp_path):
    """DeepSpeed's harness ends the whole pytest session on a hung distributed test; the
    runner records that test as failed and runs the chunk's other tests without it."""
    tests = tmp_path / "tests"
    (tests / "unit").mkdir(parents=True)
    (tests / "pytest.ini").write_text("[pytest]\n")  # the root, as DeepSpeed's tests/ is
    (tests / "unit" / "test_h.py").write_text(HANGING)
    (tests / "unit" / "test_after.py").write_text("def test_after():\n    pass\n")
    files = ["unit/test_h.py", "unit/test_after.py"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "scripts")}
    xmls = deepspeed_unit._run_chunk(tests, env, files, tmp_path / "results-00", 7)
    cases = deepspeed_unit.outcomes(xmls)
    deepspeed_unit.classify(cases)
    by_id = {c["id"]: (c["outcome"], c["cause"]) for c in cases}
    assert by_id == {
        "unit.test_h::test_first": ("passed", ""),
        "unit.test_h.TestHangs::test_it[1]": (
            "failed",
            by_id["unit.test_h.TestHangs::test_it[1]"][1],
        ),
        "unit.test_h.TestHangs::test_it[2]": ("passed", ""),
        "unit.test_h::test_last": ("passed", ""),
        "unit.test_after::test_after": ("passed", ""),
    }
    assert by_id["unit.test_h.TestHangs::test_it[1]"][1].startswith("hung: ")
    assert (
        deepspeed_unit._junit_id("unit/a/test_b.py::TestC::test[x-1]")
        == "unit.a.test_b.TestC::test[x-1]"
    )
    assert deepspeed_unit._junit_id("unit/a/test_b.py::test_f") == "unit.a.test_b::test_f"


def test_a_stopped_run_is_taken_up_where_it_stopped(tmp_path):
    """A whole-suite run takes hours: chunks finished before a stop are not run again with
    `resume`, and a chunk whose files changed is."""
    checkout = tmp_path / "checkout"
    unit = checkout / "tests" / "unit"
    unit.mkdir(parents=True)
    (checkout / "tests" / "pytest.ini").write_text("[pytest]\n")
    marks = tmp_path / "marks"
    marks.mkdir()
    for name in ("a", "b", "c"):  # each test leaves a mark each time it runs
        (unit / f"test_{name}.py").write_text(
            f"import pathlib, time\n\ndef test_{name}():\n"
            f"    pathlib.Path({str(marks)!r}, '{name}-' + str(time.monotonic_ns())).touch()\n"
        )
    work = tmp_path / "work"
    work.mkdir()
    files = ["unit/test_a.py", "unit/test_b.py", "unit/test_c.py"]
    first = deepspeed_unit.run(checkout, files[:2], work, 7, 1, resume=False)
    assert len(first) == 2 and len(list(marks.iterdir())) == 2
    # Taken up with the whole list: a and b are done, only c runs.
    again = deepspeed_unit.run(checkout, files, work, 7, 1, resume=True)
    ran = sorted(p.name.split("-")[0] for p in marks.iterdir())
    assert ran == ["a", "b", "c"]
    cases = deepspeed_unit.outcomes(again)
    assert sorted(c["id"] for c in cases if c["outcome"] == "passed") == [
        "unit.test_a::test_a", "unit.test_b::test_b", "unit.test_c::test_c",
    ]  # fmt: skip
    # Another selection of files in the same folder finds its chunks (named by their
    # files); a chunk of other files runs.
    deepspeed_unit.run(checkout, files[2:], work, 7, 1, resume=True)
    assert len(list(marks.iterdir())) == 3
    deepspeed_unit.run(checkout, files[1:], work, 7, 2, resume=True)
    assert sorted(p.name.split("-")[0] for p in marks.iterdir()) == ["a", "b", "b", "c", "c"]

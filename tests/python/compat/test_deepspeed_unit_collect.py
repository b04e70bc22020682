"""Every DeepSpeed unit test file in scope (scripts/deepspeed_unit_scope.py: all of
tests/unit but the features zerostream refuses by name) imports on the package: pytest
--collect-only over all of them in .venv-dsunit, as scripts/deepspeed-unit.sh runs them.
A file that fails there fails before its first assertion, every test in it at once, and
the full run (hours) is too slow to notice; this takes about 30 s.

KNOWN lists the files that fail today, each with the words its import error must contain
and why. A file failing that is not listed fails this test, and so does a listed one that
now imports (take it off the list: its tests now count). Found at DeepSpeed edaa722,
2026-11-29 (`scripts/deepspeed-unit.sh <checkout> --collect`)."""

import json
import subprocess

from prerequisites import REPO, missing

CHECKOUT = REPO.parent / "shared" / "deepspeed"  # beside the repository, as conftest.SHARED

NOT_BUILT = "not built"  # a DeepSpeed feature zerostream does not have yet
INTERNAL = "internal"  # imports a DeepSpeed internal at module level
OPEN = "open"  # a public name the package lacks (reported 2026-11-29)
EVERY_PACKAGE = "every package"  # fails the same on DeepSpeed itself here

KNOWN: dict[str, tuple[str, str, str]] = {
    "unit/v1/nvme/test_gds.py": (NOT_BUILT, "GDSBuilder", "GPUDirect Storage (the gds op)"),
    "unit/utils/test_nvtx.py": (
        OPEN, "deepspeed.utils.nvtx",
        "deepspeed.utils.nvtx is missing (on DeepSpeed the file fails too: it imports the "
        "checkout's accelerator/ package)"),
    "unit/runtime/test_engine_eigenvalue.py": (
        EVERY_PACKAGE, "_eigenvalue_summary_events",
        "a private engine function DeepSpeed 0.19.8 lacks too (newer than the release)"),
    "unit/runtime/test_mup_optimizers.py": (
        EVERY_PACKAGE, "No module named 'mup'", "imports the mup package, not installed"),
    "unit/runtime/zero/test_zero_autocast_mixed_dtype.py": (
        INTERNAL, "get_allgather_dtype", "partition_parameters.get_allgather_dtype"),
    "unit/runtime/zero/test_zero_late_module_attach.py": (
        INTERNAL, "parameter_offload", "runtime.zero.parameter_offload (ZeROOrderedDict)"),
    "unit/runtime/zero/test_zero_linear_direct_init.py": (
        INTERNAL, "InsertPostInitMethodToModuleSubClasses",
        "partition_parameters.InsertPostInitMethodToModuleSubClasses"),
}  # fmt: skip


def test_every_in_scope_deepspeed_unit_file_imports(tmp_path):
    if not (CHECKOUT / "tests" / "unit" / "common.py").is_file():
        missing(f"no DeepSpeed checkout at {CHECKOUT} (its tests/ folder)")
    if not (REPO / ".venv-dsunit" / ".zs-dsunit.sha1").is_file():
        missing(".venv-dsunit is missing: scripts/deepspeed-unit.sh --setup makes it")
    out = tmp_path / "collect.json"
    done = subprocess.run(
        [str(REPO / "scripts" / "deepspeed-unit.sh"), str(CHECKOUT), "--collect",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and out.is_file(), done.stdout[-4000:] + done.stderr[-4000:]
    found = json.loads(out.read_text())
    assert found["package"] == "zerostream" and "zerostream" in found["package_version"]
    errors = found["errors"]
    unknown = {f: e for f, e in errors.items() if f not in KNOWN}
    changed = {f: e for f, e in errors.items() if f in KNOWN and KNOWN[f][1] not in e}
    now_import = sorted(set(KNOWN) - set(errors))
    lines = [f"  {f}: {e}" for f, e in sorted(unknown.items())]
    lines += [f"  {f}: now fails otherwise: {e}" for f, e in sorted(changed.items())]
    lines += [f"  {f}: imports now: take it off KNOWN" for f in now_import]
    assert not lines, "DeepSpeed unit files, import on zerostream's package:\n" + "\n".join(lines)
    # The files that import were collected: most hold tests (a few skip at module level).
    assert len(found["files"]) >= 100, found["files"]
    assert sum(found["tests"].values()) >= 2000, sum(found["tests"].values())

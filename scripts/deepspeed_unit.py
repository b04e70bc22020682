"""DeepSpeed's own unit tests (`tests/unit` of a DeepSpeed checkout) against a `deepspeed`
package: zerostream's compatibility package, or DeepSpeed itself as the peer that sets the
denominator.

Run through scripts/deepspeed-unit.sh, which makes the environment. The files run are every
test file under tests/unit except the features zerostream refuses by name
(deepspeed_unit_scope.py's OUT_OF_SCOPE, one reason each); `--files` runs a subset.

  scripts/deepspeed-unit.sh CHECKOUT [--files ...]         zerostream's package, results in
                                                           build/deepspeed-unit/zerostream.json
  scripts/deepspeed-unit.sh --peer CHECKOUT [--files ...]  DeepSpeed itself (.venv-deepspeed):
                                                           build/deepspeed-unit/deepspeed.json
  scripts/deepspeed-unit.sh --compare PEER.json OURS.json  the count (deepspeed_unit_compare.py)
  scripts/deepspeed-unit.sh CHECKOUT --collect             import every file, run nothing

The count is the comparison's: of the tests DeepSpeed itself passes on this machine, how many
zerostream passes. Within one run, each failing or erroring test is matched against CAUSES
(deepspeed_unit_causes.py) to explain it, landing in one class:

- passed
- skipped: the test skipped itself (DeepSpeed's own reasons: no fp16 on CPU, a world size
  above the CPU accelerator's device count, a CUDA-only op)
- cuda: fails on the CPU for every package (a GPU tensor, a CUDA op, a DDP reference built
  with `device_ids` on a CPU module)
- internal: reads a private DeepSpeed name (the cause names it)
- failed: everything else, with its cause or "unexplained"

The classes explain; they never take a test out of the comparison's denominator.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepspeed_unit_causes import CAUSES  # noqa: E402
from deepspeed_unit_compare import compare, print_comparison  # noqa: E402
from deepspeed_unit_scope import in_scope_files  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "build" / "deepspeed-unit"

# DeepSpeed's pytest.ini addopts, kept: the marked tiers it leaves out by default.
ADDOPTS = (
    "not sequential and not nightly and not inference and not seq_inference and not "
    "inference_ops and not inference_v2 and not inference_v2_ops and not stable_diffusion "
    "and not evaluation"
)


def _prepare(checkout: Path, files: list[str], workdir: Path, timeout: int) -> tuple[Path, dict]:
    """A copy of the checkout's tests/ in `workdir` (its conftest puts the checkout's root
    first on sys.path, where a source tree's `deepspeed/` would shadow the package under
    test), and the environment pytest runs in."""
    tests = workdir / "tests"
    if tests.exists():
        shutil.rmtree(tests)
    shutil.copytree(checkout / "tests", tests)
    missing = [f for f in files if not (tests / f.split("::")[0]).is_file()]  # or node ids
    if missing:
        sys.exit(f"deepspeed-unit: {checkout}/tests lacks {', '.join(missing)}")
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "LOCAL_SIZE": os.environ.get("LOCAL_SIZE", "2"),
        "DS_UNITTEST_TIMEOUT": str(timeout),
        "TOKENIZERS_PARALLELISM": "false",
    }
    return tests, env


def _pytest(*args: str) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
        "-m", ADDOPTS, "-o", "addopts=", "--continue-on-collection-errors", *args,
    ]  # fmt: skip


def run(checkout: Path, files: list[str], workdir: Path, timeout: int, chunk: int) -> list[Path]:
    """Runs `files` (paths under tests/) in a copy of the checkout's tests/, `chunk` files to
    a pytest process, each writing its own junit XML (a run stopped part way keeps the
    chunks it finished); returns the XML files."""
    tests, env = _prepare(checkout, files, workdir, timeout)
    xmls = []
    for first in range(0, len(files), chunk):
        part = files[first : first + chunk]
        xml = workdir / f"results-{first // chunk:02d}.xml"
        cmd = _pytest(f"--junitxml={xml}", "-q", "--no-header", "-rN", f"--timeout={timeout * 2}",
                      *part)  # fmt: skip
        print(f"[deepspeed-unit] files {first + 1}-{first + len(part)} of {len(files)}", flush=True)
        subprocess.run(cmd, cwd=tests, env=env, check=False)
        if not xml.is_file():
            sys.exit(f"deepspeed-unit: pytest wrote no {xml}")
        xmls.append(xml)
    return xmls


def collect(checkout: Path, files: list[str], workdir: Path) -> dict:
    """Imports every file of `files` as the run would (pytest --collect-only, the same
    marker filter) and runs nothing: {"tests": {file: tests selected}, "errors": {file: the
    import error}} (deepspeed_unit_collect.py)."""
    tests, env = _prepare(checkout, files, workdir, 0)
    out = workdir / "collect.json"
    env["ZS_DSUNIT_COLLECT_OUT"] = str(out)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO / "scripts"), env.get("PYTHONPATH")])
    )
    cmd = _pytest("--collect-only", "-q", "-p", "deepspeed_unit_collect", *files)
    done = subprocess.run(cmd, cwd=tests, env=env, capture_output=True, text=True, check=False)
    if not out.is_file():
        sys.exit(f"deepspeed-unit: pytest --collect-only wrote nothing:\n{done.stdout[-3000:]}"
                 f"{done.stderr[-3000:]}")  # fmt: skip
    found = json.loads(out.read_text())
    found["files"] = files
    return found


def print_collection(found: dict) -> None:
    errors = found["errors"]
    total = sum(found["tests"].values())
    for path in sorted(errors):
        print(f"[fails at import] {path}: {errors[path]}")
    print(f"\n{len(found['files'])} files: {total} tests collected; {len(errors)} files fail "
          "at import or collection")  # fmt: skip


def outcomes(xmls: list[Path]) -> list[dict]:
    """One dict per test case: id, outcome (passed/skipped/failed), message. Reports given
    later replace earlier ones (a rerun after a fix): a test's later record replaces its
    earlier one, and any later record of a module replaces that module's earlier import
    failure (`::unit.x.test_y`)."""
    merged: dict = {}
    for xml in xmls:
        run = _outcomes_of(xml)
        owners = {c["id"].split("::", 1)[0] for c in run}  # module, or module.Class
        for ident in [i for i in merged if i.startswith("::")]:
            module = ident[2:]
            if any(o == module or o.startswith(module + ".") for o in owners):
                del merged[ident]
        for case in run:
            merged.pop(case["id"], None)  # re-inserted last: the later record's place
            merged[case["id"]] = case
    return list(merged.values())


def _outcomes_of(xml: Path) -> list[dict]:
    cases: list[dict] = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        module = case.get("classname", "")
        ident = f"{module}::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                message = (node.get("message") or "") + "\n" + (node.text or "")
                break
        if outcome == "passed" and cases and cases[-1]["id"] == ident:
            continue  # a teardown error after a pass is its own record
        cases.append({"id": ident, "outcome": outcome, "message": message})
    return cases


def classify(cases: list[dict]) -> None:
    """Sets each case's `class` and `cause` from CAUSES (first match: id regex, message
    regex)."""
    for case in cases:
        case["class"], case["cause"] = case["outcome"], ""
        if case["outcome"] != "failed":
            continue
        for klass, id_re, msg_re, why in CAUSES:
            if re.search(id_re, case["id"]) and re.search(msg_re, case["message"], re.S):
                case["class"], case["cause"] = klass, why
                break
        else:
            case["cause"] = "unexplained: " + _first_error_line(case["message"])


def _first_error_line(message: str) -> str:
    for line in message.splitlines():
        line = line.strip()
        if re.match(r"^(E\s+)?\w*(Error|Exception|Interrupt)\b", line) or line.startswith("E "):
            return line[:200]
    return message.strip().splitlines()[0][:200] if message.strip() else "(no message)"


def report(cases: list[dict], seconds: float, package: str = "zerostream") -> dict:
    """Prints one run's cases by class and cause; returns the counts. No rate: what counts
    is what DeepSpeed itself passes (--compare)."""
    counts = Counter(c["class"] for c in cases)
    summary = {
        "tests": len(cases),
        **{k: counts[k] for k in ("passed", "failed", "skipped", "cuda", "internal")},
        "seconds": round(seconds),
    }
    by_cause = defaultdict(list)
    for c in cases:
        if c["class"] in ("failed", "cuda", "internal"):
            by_cause[(c["class"], c["cause"])].append(c["id"])
    print(f"\n== DeepSpeed unit tests on {package} ({summary['seconds']} s)")
    for klass, cause in sorted(by_cause, key=lambda k: (k[0], -len(by_cause[k]))):
        ids = by_cause[(klass, cause)]
        print(f"\n[{klass}] {len(ids)}: {cause}")
        for ident in ids[:40]:
            print(f"    {ident}")
        if len(ids) > 40:
            print(f"    ... and {len(ids) - 40} more")
    print(
        f"\n{summary['tests']} tests: {summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['skipped']} skipped by DeepSpeed, {summary['cuda']} fail on a CPU for every "
        f"package, {summary['internal']} read DeepSpeed internals"
    )
    print("(the count against DeepSpeed itself: scripts/deepspeed-unit.sh --compare)")
    return summary


def package_version(package: str) -> str:
    """The version of the `deepspeed` this interpreter's environment imports, checked to be
    the package the run is labelled with (a zerostream run that found DeepSpeed, or the
    reverse, would compare a package with itself)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import deepspeed; print(deepspeed.__version__)"],
        capture_output=True, text=True, env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )  # fmt: skip
    lines = probe.stdout.strip().splitlines()
    if probe.returncode != 0 or not lines:
        sys.exit(f"deepspeed-unit: `import deepspeed` fails here:\n{probe.stderr[-2000:]}")
    check_label(package, lines[-1])
    return lines[-1]


def check_label(package: str, version: str | None) -> None:
    if version is None or ("zerostream" in version) != (package == "zerostream"):
        sys.exit(f"deepspeed-unit: the run is labelled {package}, but `import deepspeed` here "
                 f"is {version}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkout", type=Path, nargs="?", help="a DeepSpeed checkout (its tests/)")
    ap.add_argument("--files", nargs="+", help="files under tests/ (default: all in scope)")
    ap.add_argument("--package", choices=("zerostream", "deepspeed"), default="zerostream")
    ap.add_argument("--json", type=Path, help="output (default: under build/deepspeed-unit/)")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it")
    ap.add_argument("--xml", type=Path, nargs="+", help="classify earlier junit XMLs, run nothing")
    ap.add_argument("--collect", action="store_true", help="only import every file (pytest)")
    ap.add_argument("--compare", type=Path, nargs=2, metavar=("PEER_JSON", "OURS_JSON"),
                    help="DeepSpeed's run against zerostream's; runs nothing")  # fmt: skip
    ap.add_argument("--chunk", type=int, default=8, help="files to a pytest process")
    ap.add_argument("--timeout", type=int, default=300, help="seconds a distributed test may take")
    args = ap.parse_args()
    if args.compare:
        peer, ours = (json.loads(p.read_text()) for p in args.compare)
        if peer.get("package") != "deepspeed" or ours.get("package") != "zerostream":
            sys.exit("deepspeed-unit: --compare takes DeepSpeed's JSON first, zerostream's second")
        result = compare(peer, ours)
        print_comparison(result)
        out = args.json or RESULTS / "compare.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        print(f"(written to {out})")
        return
    start = time.monotonic()
    version = None
    if args.xml:
        xmls = args.xml
    else:
        if args.checkout is None or not (args.checkout / "tests" / "unit" / "common.py").is_file():
            sys.exit(
                f"deepspeed-unit: {args.checkout} is not a DeepSpeed checkout "
                "(no tests/unit/common.py)"
            )
        files = args.files or in_scope_files(args.checkout / "tests")
        workdir = args.keep or Path(tempfile.mkdtemp(prefix="ds-unit-"))
        workdir.mkdir(parents=True, exist_ok=True)
        if args.collect:
            found = collect(args.checkout, files, workdir)
            check_label(args.package, found["package_version"])
            print_collection(found)
            out = args.json or RESULTS / f"collect-{args.package}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"package": args.package, **found}, indent=1))
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
            return
        version = package_version(args.package)
        xmls = run(args.checkout, files, workdir, args.timeout, args.chunk)
    cases = outcomes(xmls)
    classify(cases)
    summary = report(cases, time.monotonic() - start, args.package)
    out = args.json or RESULTS / f"{args.package}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"package": args.package, "package_version": version, "summary": summary,
              "cases": cases}  # fmt: skip
    out.write_text(json.dumps(record, indent=1))
    print(f"(written to {out})")
    if not args.keep and not args.xml:
        shutil.rmtree(xmls[0].parent, ignore_errors=True)


if __name__ == "__main__":
    main()

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
import hashlib
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
from deepspeed_unit_compare import (  # noqa: E402
    compare,
    markdown_table,
    per_file,
    print_causes,
    print_comparison,
)
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


def run(
    checkout: Path, files: list[str], workdir: Path, timeout: int, chunk: int, resume: bool
) -> list[Path]:
    """Runs `files` (paths under tests/) in a copy of the checkout's tests/, `chunk` files to
    a pytest process, each writing its own junit XML (a run stopped part way keeps the
    chunks it finished); returns the XML files. Each finished chunk leaves a record of its
    files and XMLs; with `resume`, a chunk whose record names the same files is not run
    again (a whole-suite run takes hours: it can be stopped and taken up later)."""
    tests, env = _prepare(checkout, files, workdir, timeout)
    xmls = []
    for first in range(0, len(files), chunk):
        part = files[first : first + chunk]
        # Named by its files, so a run of other files (--files) in the same folder keeps it.
        stem = workdir / f"results-{hashlib.sha1(' '.join(part).encode()).hexdigest()[:12]}"
        record = stem.with_name(stem.name + "-done.json")
        if resume and record.is_file():
            done = json.loads(record.read_text())
            if done["files"] == part and all((workdir / x).is_file() for x in done["xmls"]):
                print(f"[deepspeed-unit] files {first + 1}-{first + len(part)}: done before "
                      f"({done['finished']})", flush=True)  # fmt: skip
                xmls += [workdir / x for x in done["xmls"]]
                continue
        print(f"[deepspeed-unit] files {first + 1}-{first + len(part)} of {len(files)}", flush=True)
        part_xmls = _run_chunk(tests, env, part, stem, timeout)
        record.write_text(json.dumps({
            "files": part, "xmls": [x.name for x in part_xmls],
            "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
            # the package's commit, where the caller names it (deepspeed-unit-whole.sh)
            "commit": os.environ.get("ZS_DSUNIT_COMMIT"),
        }))  # fmt: skip
        xmls += part_xmls
    return xmls


# What DeepSpeed's harness (tests/unit/common.py) prints when a distributed test's ranks are
# not done within DS_UNITTEST_TIMEOUT: it then ends the whole pytest session (pytest.exit).
HANG = "Test hanged, exiting"


def _run_chunk(tests: Path, env: dict, part: list[str], stem: Path, timeout: int) -> list[Path]:
    """Runs `part` in one pytest process. When DeepSpeed's harness ends the session on a
    hung test, that test is recorded as failed (a junit XML of its own) and the rest of
    `part` runs in a new process, without the tests recorded so far; returns every XML."""
    xmls: list[Path] = []
    order: list[str] | None = None  # the chunk's node ids, in run order
    for attempt in range(10_000):
        xml = stem.with_name(f"{stem.name}{f'-{attempt}' if attempt else ''}.xml")
        done: set[str] = set()
        for earlier in xmls:
            done |= {c["id"] for c in _outcomes_of(earlier)}
        skip = [f"--deselect={n}" for n in (order or []) if _junit_id(n) in done]
        cmd = _pytest(f"--junitxml={xml}", "-q", "--no-header", "-rN",
                      f"--timeout={timeout * 2}", *skip, *part)  # fmt: skip
        hung = _run_echoing(cmd, tests, env)
        if not xml.is_file():
            sys.exit(f"deepspeed-unit: pytest wrote no {xml}")
        xmls.append(xml)
        if not hung:
            return xmls
        if order is None:
            order = _collect_in(tests, env, part, stem.with_name(stem.name + "-order.json"))[
                "items"
            ]
        done |= {c["id"] for c in _outcomes_of(xml)}
        pending = [n for n in order if _junit_id(n) not in done]
        if not pending:
            return xmls
        hung_xml = stem.with_name(f"{stem.name}-hung-{attempt}.xml")
        _write_hung(hung_xml, _junit_id(pending[0]), timeout)
        xmls.append(hung_xml)
        print(f"[deepspeed-unit] {pending[0]} hung: recorded, going on without it", flush=True)
    sys.exit(f"deepspeed-unit: {stem} did not finish")


def _run_echoing(cmd: list[str], cwd: Path, env: dict) -> bool:
    """Runs `cmd`, its output passed through; True when DeepSpeed's harness ended it on a
    hung test."""
    hung = False
    out, err = subprocess.PIPE, subprocess.STDOUT
    with subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True, errors="replace"
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            hung = hung or HANG in line
    sys.stdout.flush()
    return hung


def _junit_id(node_id: str) -> str:
    """pytest's node id (`unit/x/test_y.py::TestA::test[1]`) as the junit XML's id
    (`unit.x.test_y.TestA::test[1]`), the id the records use."""
    path, *rest = node_id.split("::")
    owner = ".".join([path.removesuffix(".py").replace("/", "."), *rest[:-1]])
    return f"{owner}::{rest[-1]}" if rest else f"::{owner}"


def _write_hung(xml: Path, case_id: str, timeout: int) -> None:
    owner, name = case_id.split("::", 1)
    suite = ET.Element("testsuites")
    case = ET.SubElement(ET.SubElement(suite, "testsuite", name="pytest"), "testcase",
                         classname=owner, name=name)  # fmt: skip
    message = (
        f"TimeoutError: hung: its ranks were not done within {timeout} s, and DeepSpeed's "
        f"harness ended the session ('{HANG}'); the files' other tests ran without it"
    )
    ET.SubElement(case, "failure", message=message)
    ET.ElementTree(suite).write(xml, encoding="utf-8", xml_declaration=True)


def _collect_in(tests: Path, env: dict, files: list[str], out: Path) -> dict:
    """pytest --collect-only over `files` in the prepared `tests` (deepspeed_unit_collect.py):
    {"items": node ids in run order, "tests": {file: count}, "errors": {file: import error},
    "package_version"}."""
    env = {**env, "ZS_DSUNIT_COLLECT_OUT": str(out)}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO / "scripts"), env.get("PYTHONPATH")])
    )
    cmd = _pytest("--collect-only", "-q", "-p", "deepspeed_unit_collect", *files)
    done = subprocess.run(cmd, cwd=tests, env=env, capture_output=True, text=True, check=False)
    if not out.is_file():
        sys.exit(
            f"deepspeed-unit: pytest --collect-only wrote nothing:\n{done.stdout[-3000:]}"
            f"{done.stderr[-3000:]}"
        )
    return json.loads(out.read_text())


def collect(checkout: Path, files: list[str], workdir: Path) -> dict:
    """Imports every file of `files` as the run would (pytest --collect-only, the same
    marker filter) and runs nothing: {"tests": {file: tests selected}, "errors": {file: the
    import error}, ...} (deepspeed_unit_collect.py)."""
    tests, env = _prepare(checkout, files, workdir, 0)
    found = _collect_in(tests, env, files, workdir / "collect.json")
    found["files"] = files
    del found["items"]
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
        if case.get("name") is None:  # the test a pytest.exit interrupted: no record
            continue
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
    for line in message.splitlines():  # pytest's `E   SomeError: ...` line first
        if re.match(r"^E\s+\w*(Error|Exception)\b", line.strip()):
            return re.sub(r"\s+\(/[^)]*\)$", "", line.strip())[:200]  # no install path
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
    print_causes(by_cause, key=lambda k: (k[0], -len(by_cause[k])))
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


# DeepSpeed's CPU ops, which its tests load (the comm op at every distributed test's init).
# Installed with DS_BUILD_OPS=0, DeepSpeed compiles each on first use; built here first, the
# first test to load one does not spend its timeout compiling (the builds are cached in
# ~/.cache/torch_extensions).
PEER_OPS = ("ShareMemCommBuilder", "CPUAdamBuilder", "CPUAdagradBuilder", "CPULionBuilder",
            "FusedAdamBuilder", "AsyncIOBuilder", "PinMemoryBuilder")  # fmt: skip
_BUILD = """
import sys
from deepspeed.accelerator import get_accelerator
failed = False
for name in sys.argv[1:]:
    try:
        get_accelerator().create_op_builder(name).load()
        print(f"[deepspeed-unit] DeepSpeed's {name}: built", flush=True)
    except Exception as e:  # DeepSpeed's own tests skip or fail on it then
        print(f"[deepspeed-unit] DeepSpeed's {name}: not built: {e}", flush=True)
        failed = True
sys.exit(1 if failed else 0)
"""


def prebuild_ops(workdir: Path, version: str | None) -> None:
    """Builds (or loads) DeepSpeed's CPU ops once per kept folder and DeepSpeed version: a
    run file by file (deepspeed-unit-whole.sh) would otherwise load all seven each time."""
    marker = workdir / "ops-built"
    if marker.is_file() and marker.read_text() == str(version):
        return
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    done = subprocess.run([sys.executable, "-c", _BUILD, *PEER_OPS], env=env, check=False)
    if done.returncode == 0:  # an op that did not build is tried again by the next run
        marker.write_text(str(version))


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
    ap.add_argument("--markdown", type=Path,
                    help="with --compare: write the per-file table (Markdown) here")
    ap.add_argument("--chunk", type=int, default=8, help="files to a pytest process")
    ap.add_argument("--resume", action="store_true",
                    help="with --keep: skip the chunks a stopped run finished there")  # fmt: skip
    ap.add_argument("--timeout", type=int, default=300, help="seconds a distributed test may take")
    args = ap.parse_args()
    if args.compare:
        peer, ours = (json.loads(p.read_text()) for p in args.compare)
        if peer.get("package") != "deepspeed" or ours.get("package") != "zerostream":
            sys.exit("deepspeed-unit: --compare takes DeepSpeed's JSON first, zerostream's second")
        result = compare(peer, ours)
        result["files"] = per_file(peer, ours, result)
        print_comparison(result)
        if args.markdown:
            args.markdown.write_text(markdown_table(result["files"]))
            print(f"(the per-file table written to {args.markdown})")
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
        workdir = (args.keep or Path(tempfile.mkdtemp(prefix="ds-unit-"))).resolve()
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
        if args.package == "deepspeed":
            prebuild_ops(workdir, version)
        if args.resume and not args.keep:
            sys.exit("deepspeed-unit: --resume takes up a run kept with --keep DIR")
        xmls = run(args.checkout, files, workdir, args.timeout, args.chunk, args.resume)
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

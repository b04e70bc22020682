"""A pytest plugin (`-p deepspeed_unit_collect`, with scripts/ on the path) that writes what
a `--collect-only` run found to the JSON file named by ZS_DSUNIT_COLLECT_OUT: per test
file, the number of tests selected and the error that stopped its import, if any; every
test's node id in run order; and the version of the `deepspeed` they imported.
scripts/deepspeed_unit.py --collect runs it; a test file that fails here fails before its
first assertion."""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter

_errors: dict[str, str] = {}
_tests: Counter = Counter()
_items: list[str] = []


def _import_error(text: str) -> str:
    """The line that says why the import failed (pytest's `E   ...` line), else the last."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("E "):
            return re.sub(r"\s+\(/[^)]*\)$", "", line[1:].strip())  # no install path
    return lines[-1] if lines else "(no message)"


def pytest_collectreport(report):
    if report.failed and report.nodeid:
        _errors[report.nodeid.split("::")[0]] = _import_error(str(report.longrepr))


def pytest_collection_finish(session):
    for item in session.items:
        _tests[item.nodeid.split("::")[0]] += 1
        _items.append(item.nodeid)


def pytest_sessionfinish(session):
    out = os.environ.get("ZS_DSUNIT_COLLECT_OUT")
    if out:
        with open(out, "w") as f:
            module = sys.modules.get("deepspeed")  # the test files imported it
            found = {"tests": dict(_tests), "errors": _errors, "items": _items,
                     "package_version": getattr(module, "__version__", None)}  # fmt: skip
            json.dump(found, f, indent=1, sort_keys=True)

"""DeepSpeed's unit tests, DeepSpeed itself against zerostream: the denominator is the tests
DeepSpeed passes on this machine, whatever zerostream's classes say.

Reads the JSON that scripts/deepspeed_unit.py writes for each package (`--package
deepspeed` and `--package zerostream` over the same files), so the comparison can be
recomputed without rerunning:

  scripts/deepspeed-unit.sh --compare build/deepspeed-unit/deepspeed.json \
      build/deepspeed-unit/zerostream.json

For every test DeepSpeed passes that zerostream does not, it gives zerostream's outcome and
cause; the cause's class (cuda, internal, failed, skipped) only explains, it never takes a
test out of the count.
"""

from __future__ import annotations

from collections import defaultdict


def _owner(case_id: str) -> str:
    """`unit.x.test_y.TestA::test[1]` -> `unit.x.test_y.TestA` (module, or module.Class)."""
    return case_id.split("::", 1)[0]


def _import_failure(ours_by_id: dict, case_id: str) -> dict | None:
    """zerostream's record of the module of `case_id` failing to import
    (`::unit.x.test_y`), if there is one."""
    owner = _owner(case_id)
    parts = owner.split(".")
    for n in range(len(parts), 0, -1):
        record = ours_by_id.get("::" + ".".join(parts[:n]))
        if record is not None:
            return record
    return None


def compare(peer: dict, ours: dict) -> dict:
    """`peer` and `ours`: the JSON of one run each ({"summary", "cases"[, "package"]}).
    Returns the comparison: counts, and every test DeepSpeed passes that zerostream does not,
    with zerostream's outcome, class and cause."""
    ours_by_id = {c["id"]: c for c in ours["cases"]}
    denominator = [c["id"] for c in peer["cases"] if c["outcome"] == "passed"]
    lost = []
    passed = 0
    for case_id in denominator:
        record = ours_by_id.get(case_id) or _import_failure(ours_by_id, case_id)
        if record is None:
            lost.append({"id": case_id, "outcome": "not run", "class": "not run",
                         "cause": "absent from zerostream's run (another file set, or a run "
                                  "stopped part way)"})  # fmt: skip
        elif record["outcome"] == "passed":
            passed += 1
        else:
            cause = record.get("cause") or record.get("message", "")[:200]
            klass = record.get("class", record["outcome"])
            lost.append({"id": case_id, "outcome": record["outcome"], "class": klass,
                         "cause": cause})  # fmt: skip
    peer_pass = set(denominator)
    beyond = sorted(
        c["id"] for c in ours["cases"] if c["outcome"] == "passed" and c["id"] not in peer_pass
    )
    return {
        "deepspeed": peer.get("package_version"),
        "zerostream": ours.get("package_version"),
        "deepspeed_tests": len(peer["cases"]),
        "deepspeed_passed": len(denominator),
        "zerostream_passed_of_those": passed,
        "rate": round(passed / len(denominator), 4) if denominator else None,
        "deepspeed_passes_zerostream_does_not": lost,
        "zerostream_passes_deepspeed_does_not": beyond,
    }


def file_of(case_id: str) -> str:
    """`unit.x.test_y.TestA::test[1]` -> `unit/x/test_y.py` (a class name starts with an
    upper-case letter; a module that failed to import is `::unit.x.test_y`)."""
    owner = _owner(case_id) or case_id.lstrip(":")
    parts = owner.split(".")
    while len(parts) > 1 and parts[-1][:1].isupper():
        parts.pop()
    return "/".join(parts) + ".py"


def per_file(peer: dict, ours: dict, result: dict) -> list:
    """One row a file: what DeepSpeed ran, passed and skipped, what zerostream passed and
    skipped, passed by both, by DeepSpeed only (the comparison's list) and by zerostream
    only. A zerostream module that failed to import counts as every test of it not passed."""
    rows = defaultdict(lambda: dict.fromkeys(
        ("ds_ran", "ds_passed", "ds_skipped", "zs_passed", "zs_skipped", "both",
         "ds_only", "zs_only"), 0))  # fmt: skip
    for c in peer["cases"]:
        row = rows[file_of(c["id"])]
        row["ds_ran"] += 1
        row["ds_passed"] += c["outcome"] == "passed"
        row["ds_skipped"] += c["outcome"] == "skipped"
    for c in ours["cases"]:
        if c["id"].startswith("::"):
            continue
        row = rows[file_of(c["id"])]
        row["zs_passed"] += c["outcome"] == "passed"
        row["zs_skipped"] += c["outcome"] == "skipped"
    for case in result["deepspeed_passes_zerostream_does_not"]:
        rows[file_of(case["id"])]["ds_only"] += 1
    for case_id in result["zerostream_passes_deepspeed_does_not"]:
        rows[file_of(case_id)]["zs_only"] += 1
    out = []
    for name in sorted(rows):
        row = rows[name]
        row["both"] = row["ds_passed"] - row["ds_only"]
        out.append({"file": name, **row})
    return out


def markdown_table(rows: list) -> str:
    """The per-file rows as a Markdown table, with the totals last."""
    keys = ("ds_ran", "ds_passed", "ds_skipped", "zs_passed", "zs_skipped", "both", "ds_only",
            "zs_only")  # fmt: skip
    head = ("| file | DeepSpeed ran | DeepSpeed passed | DeepSpeed skipped "
            "| zerostream passed | zerostream skipped | passed by both | DeepSpeed only "
            "| zerostream only |")  # fmt: skip
    lines = [head, "|---" * 9 + "|"]
    for row in rows:
        lines.append(f"| `{row['file']}` | " + " | ".join(str(row[k]) for k in keys) + " |")
    total = {k: sum(r[k] for r in rows) for k in keys}
    lines.append(f"| **{len(rows)} files** | " + " | ".join(f"**{total[k]}**" for k in keys) + " |")
    return "\n".join(lines) + "\n"


def print_causes(by_cause: dict, key) -> None:
    """Each (class, cause) of `by_cause` (-> test ids), in `key`'s order, with its first 40
    ids (the runner's report and the comparison print them alike)."""
    for klass, cause in sorted(by_cause, key=key):
        ids = by_cause[(klass, cause)]
        print(f"\n[{klass}] {len(ids)}: {cause}")
        for ident in ids[:40]:
            print(f"    {ident}")
        if len(ids) > 40:
            print(f"    ... and {len(ids) - 40} more")


def print_comparison(result: dict) -> None:
    lost = result["deepspeed_passes_zerostream_does_not"]
    by_cause = defaultdict(list)
    for case in lost:
        by_cause[(case["class"], case["cause"])].append(case["id"])
    print(f"\n== DeepSpeed's unit tests: DeepSpeed {result['deepspeed']} against zerostream "
          f"{result['zerostream']}")  # fmt: skip
    print("\nPassed by DeepSpeed, not by zerostream, by cause ([zerostream's class] count):")
    print_causes(by_cause, key=lambda k: (-len(by_cause[k]), k))
    beyond = result["zerostream_passes_deepspeed_does_not"]
    if beyond:
        print(f"\nPassed by zerostream, not by DeepSpeed here (not counted): {len(beyond)}")
        for ident in beyond[:20]:
            print(f"    {ident}")
        if len(beyond) > 20:
            print(f"    ... and {len(beyond) - 20} more")
    n, p = result["deepspeed_passed"], result["zerostream_passed_of_those"]
    print(f"\nDeepSpeed ran {result['deepspeed_tests']} tests and passed {n} on this machine "
          "(the denominator).")  # fmt: skip
    if n:
        print(f"zerostream passes {p} of those {n}: {p / n:.1%}; {n - p} do not (above).")

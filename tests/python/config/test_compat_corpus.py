"""Every ds_config of the shared compatibility corpus gets the outcome its MANIFEST.tsv names,
and accepted files resolve the ZeRO, offload, precision and batch values DeepSpeed would use."""

import csv
import json
import math
import re

import hjson
from deepspeed_reference import expected_values

from zerostream import cli, config_check


def manifest_rows(compat_dir):
    with open(compat_dir / "MANIFEST.tsv", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def rejected_keys(why: str):
    """'DeepSpeed 0.19.6 rejects: a.b, c.d (zerostream must ...)' -> ['a.b', 'c.d']."""
    m = re.search(r"rejects: (.*?) \(", why)
    assert m, f"unexpected manifest text: {why}"
    return [k.strip() for k in m.group(1).split(",")]


def world_size_for(raw):
    return raw.get("sequence_parallel_size", 1) if isinstance(raw, dict) else 1


def test_manifest_lists_every_file(compat_dir):
    listed = {row["file"] for row in manifest_rows(compat_dir)}
    on_disk = {p.name for p in compat_dir.glob("*.json")}
    assert listed == on_disk
    assert len(listed) >= 50


def test_every_file_gets_its_manifest_outcome(compat_dir):
    failures = []
    outcomes = {"accept": 0, "reject_or_warn": 0, "reject": 0}
    for row in manifest_rows(compat_dir):
        path = compat_dir / row["file"]
        result = config_check.check(str(path))
        expected = row["expected"]
        outcomes[expected] += 1
        messages = result["errors"] + result["warnings"]
        if expected == "accept":
            if not result["ok"]:
                failures.append(f"{row['file']}: expected accept, got {result['errors']}")
        elif expected == "reject_or_warn":
            for key in rejected_keys(row["why"]):
                if not any(m.startswith(key + ":") or f"{key}:" in m for m in messages):
                    failures.append(f"{row['file']}: no error or warning names {key}: {messages}")
        elif expected == "reject":
            key_path = re.compile(r": [A-Za-z_][\w.\[\]]*: ")
            if result["ok"] or not any(key_path.search(e) for e in result["errors"]):
                failures.append(
                    f"{row['file']}: expected a rejection naming a key path, got {result['errors']}"
                )
        else:
            failures.append(f"{row['file']}: unknown manifest outcome {expected!r}")
    assert not failures, "\n".join(failures)
    assert all(outcomes.values()), outcomes  # the corpus exercises all three outcomes


def _same(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b)
    return a == b


def test_accepted_files_resolve_what_deepspeed_would_use(compat_dir):
    mismatches = []
    checked = 0
    for row in manifest_rows(compat_dir):
        if row["expected"] != "accept":
            continue
        path = compat_dir / row["file"]
        raw = hjson.loads(path.read_text())
        result = config_check.check(str(path), world_size=world_size_for(raw))
        assert result["ok"], (row["file"], result["errors"])
        resolved = result["resolved"]
        for key, want in expected_values(raw, world_size_for(raw)).items():
            got = resolved.get(key, {"value": None})["value"]
            checked += 1
            if not _same(got, want):
                mismatches.append(f"{row['file']}: {key}: zerostream {got!r}, DeepSpeed {want!r}")
    assert not mismatches, "\n".join(mismatches)
    assert checked > 1000


def test_manifest_columns_agree_with_resolved_stage_offload_and_precision(compat_dir):
    """The manifest's own zero_stage / offload / precision columns, as a second witness."""
    for row in manifest_rows(compat_dir):
        if row["expected"] != "accept":
            continue
        path = compat_dir / row["file"]
        r = config_check.check(str(path))["resolved"]
        stage = re.match(r"\d", row["zero_stage"])
        assert r["zero_optimization.stage"]["value"] == (int(stage.group(0)) if stage else 0)
        for col, key in (
            ("offload_optimizer", "zero_optimization.offload_optimizer.device"),
            ("offload_param", "zero_optimization.offload_param.device"),
        ):
            want = row[col].split(" ")[0]
            got = r.get(key, {"value": "-"})["value"]
            assert got == ("-" if want == "-" else want) or (want == "-" and got == "none"), (
                row["file"],
                col,
                got,
            )
        precision = row["precision"]
        if precision in ("fp16", "bf16"):
            assert r[f"{precision}.enabled"]["value"] is True, (row["file"], precision)


def test_config_check_cli_gives_each_file_its_outcome(compat_dir, capsys):
    for row in manifest_rows(compat_dir):
        path = str(compat_dir / row["file"])
        code = cli.main(["config", "check", path, "--json"])
        out = json.loads(capsys.readouterr().out)
        assert set(out) == {"ok", "errors", "warnings", "notes", "resolved"}
        assert out["ok"] == (code == 0)
        assert out["ok"] == (row["expected"] == "accept"), (row["file"], out["errors"])

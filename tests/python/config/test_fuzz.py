"""A bounded config fuzz (reliability issue 14): real ds_configs, mutated by a fixed-seed
generator, go through every config entry point, and each case ends in a config or in a
ValueError whose every line names a key path or a position; never a crash, a hang, another
exception type or a value echoed whole into the message.

Seeds are the project's configs/*.json and, when it is there, the shared compatibility corpus
(read in place, never copied). Dict cases mutate the parsed tree (delete keys, change types,
extreme numbers, odd and huge strings, odd keys, nesting) and go in as a dict; text cases
mutate the file text (truncation, BOM, duplicate keys, punctuation, odd literals and escapes,
CRLF) and go in as a file, as text to `_C.read_json_text` and through `zerostream config
check`. A few heavy cases are written out: 100,000-key objects, megabyte strings, and 50,000
levels of nesting, which run in a child process so a stack overflow fails a test instead of
ending pytest. Every case is rebuilt from its id alone: `-k dict-017` reruns one.
"""

import json
import math
import os
import pathlib
import random
import re
import subprocess
import sys
import textwrap
import time

import pytest

from zerostream import _C, cli, config, config_check

REPO = pathlib.Path(__file__).resolve().parents[3]
CORPUS = REPO.parent / "shared" / "compat" / "configs"
SEED = 14  # the number; change it only on purpose: failures must reproduce
N_DICT = 180
N_TEXT = 140
CASE_SECONDS = 5.0  # per case, entry points together; a typical case takes ~10 ms
WORLD = 2
INT64_MAX = 2**63 - 1

POSITION = re.compile(r"\(line \d+, column \d+\)|position \d+")
TOP_KEYS = {path.split(".")[0] for path in _C.accepted_key_paths()}


# --- seeds ------------------------------------------------------------------------------------


def _seed_files():
    files = sorted((REPO / "configs").glob("*.json"))
    if (CORPUS / "MANIFEST.tsv").is_file():
        files += sorted(CORPUS.glob("*.json"))
    return files


SEED_FILES = _seed_files()


def _seed_text(i: int) -> str:
    return SEED_FILES[i % len(SEED_FILES)].read_text(encoding="utf-8")


def _seed_tree(i: int):
    """The parsed seed; a seed the reader rejects (a placeholder left in) becomes {}."""
    try:
        return _C.read_json_text(_seed_text(i), "seed.json")
    except ValueError:
        return {}


# --- values and mutations ---------------------------------------------------------------------

EXTREME_NUMBERS = [
    0, -1, 1, 2, 3, 7, 2**31, -(2**31) - 1, INT64_MAX, 2**63, -(2**63), -(2**63) - 1, 2**64,
    10**30, 0.5, -0.0, 1e-300, 5e-324, 1e308, -1e308, 1.7976931348623157e308, 9.2e18, 9.3e18,
    float("nan"), float("inf"), float("-inf"),
]  # fmt: skip
ODD_STRINGS = [
    "", " ", "auto", "AUTO", "none", "cpu", "nvme", "gpu", "true", "false", "1", "0", "-1",
    "1e3", "null", "NaN", "Adam", "adamw", "WarmupLR", "fp16", "bf16", "/tmp", "/", ".",
    "\x00", "a\x00b", "\t\n\r", "\u00e9t\u00e9", "\u65e5\u672c\u8a9e", "\U0001f680", "\u202e",
    "\ufeff", "\ud800", "\udfff", "\\", '"', "{", "}", "[", "]", "//", "#", "/*",
]  # fmt: skip
ODD_KEYS = [
    "", " ", "stage ", "Stage", "STAGE", "zero optimization", "\u00e9", "\U0001f680", "\x00",
    "\ud800", "k" * 64, "__proto__", "constructor", "0", "-1", "train_batch_size",
    "zero_optimization", "offload_param", "device", "enabled", "type", "params", "auto",
]  # fmt: skip
# Tokens that replace a value in the text: what the reader's number, word and string paths see.
ODD_LITERALS = [
    "NaN", "Infinity", "-Infinity", "nan", "inf", "1e999", "-1e999", "1e-400", "-", "+1", "01",
    "1.", ".5", "1.2.3", "1e", "1e+", "0x10", "--1", "99999999999999999999999",
    "-9223372036854775808", "-9223372036854775809", "9223372036854775807", "9223372036854775808",
    "-0", "1E5", "True", "None", "tru", "nul", "'single'", '"\\ud800"', '"\\udc00"',
    '"\\ud83d\\u0041"', '"\\ud83d\\ude80"', '"\\ud83d"', '"\\u0000"', '"\\x41"', '"\\u12"',
    '"\\uZZZZ"', '"\\', '"\t"', '"a\nb"', "[]", "{}", "[,]", "{,}", "[1,,2]", '{"a" 1}',
    '{"a":}', "[[[[", "}}}}", "/* open", "// line", "# hash", "\u00e9", "\U0001f680", "@",
]  # fmt: skip
PUNCTUATION = list('{}[],:"\\/#*') + ["\n", "\r", "\t", "\x00", " ", "0", "a", "\u00e9"]


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.choice(["str", "int", "float", "bool", "null", "list", "object"])
    if kind == "str":
        return rng.choice(ODD_STRINGS)
    if kind == "int":
        return rng.choice([n for n in EXTREME_NUMBERS if isinstance(n, int)])
    if kind == "float":
        return rng.choice([n for n in EXTREME_NUMBERS if isinstance(n, float)])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if depth > 2:
        return []
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(ODD_KEYS): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def _slots(tree):
    """Every (container, key) in the tree, lists included, parents before children."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        keys = list(node) if isinstance(node, dict) else range(len(node))
        for k in keys:
            out.append((node, k))
            if isinstance(node[k], (dict, list)):
                stack.append(node[k])
    return out


def _containers(tree):
    return [tree] + [c[k] for c, k in _slots(tree) if isinstance(c[k], dict)]


def _nest(value, depth: int, rng: random.Random):
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"a": value}
    return value


def _mutate_tree(tree, rng: random.Random, ops: list) -> None:
    op = rng.choice(["delete", "retype", "retype", "number", "string", "rename", "add", "nest"])
    slots = _slots(tree)
    if op == "add" or not slots:
        target = rng.choice(_containers(tree))
        key = rng.choice(ODD_KEYS + sorted(TOP_KEYS))
        target[key] = _random_value(rng)
        ops.append(f"add {key!r}")
        return
    parent, key = rng.choice(slots)
    ops.append(f"{op} {key!r}")
    if op == "delete":
        del parent[key]
    elif op == "retype":
        parent[key] = _random_value(rng)
    elif op == "number":
        parent[key] = rng.choice(EXTREME_NUMBERS)
    elif op == "string":
        parent[key] = rng.choice(ODD_STRINGS)
    elif op == "nest":
        parent[key] = _nest(parent[key], rng.choice([1, 2, 30, 62, 63, 64, 65, 100]), rng)
    elif isinstance(parent, dict):  # rename, keeping the value
        parent[rng.choice(ODD_KEYS)] = parent.pop(key)


def _mutate_text(text: str, rng: random.Random, ops: list) -> str:
    op = rng.choice(["truncate", "bom", "duplicate", "punct", "literal", "literal", "crlf", "cut"])
    ops.append(op)
    if op == "truncate":
        return text[: rng.randrange(len(text) + 1)]
    if op == "bom":
        return "\ufeff" * rng.choice([1, 1, 2]) + text
    if op == "crlf":
        return text.replace("\n", "\r\n")
    if op == "cut":
        at = rng.randrange(len(text) + 1)
        return text[:at] + text[at + rng.randrange(1, 40) :]
    if op == "punct":
        at = rng.randrange(len(text) + 1)
        return text[:at] + rng.choice(PUNCTUATION) + text[at + rng.randrange(2) :]
    if op == "duplicate":  # the same key twice in one object, at any depth
        keys = list(re.finditer(r'\{\s*("(?:[^"\\]|\\.)*")\s*:', text))
        if not keys:
            return text
        m = rng.choice(keys)
        return text[: m.start(1)] + m.group(1) + ": null, " + text[m.start(1) :]
    values = list(re.finditer(r":\s*([^\s,{}\[\]]+)", text))  # "literal": a scalar replaced
    if not values:
        return text
    m = rng.choice(values)
    return text[: m.start(1)] + rng.choice(ODD_LITERALS) + text[m.end(1) :]


# --- the oracle -------------------------------------------------------------------------------


def _error_lines(exc: ValueError):
    """config.load's message is a header line, then one error per indented line."""
    lines = str(exc).split("\n")
    if lines[0].startswith("invalid DeepSpeed config "):
        return [line[2:] for line in lines[1:]]
    return [str(exc)]


def _check_message(msg: str, source: str, top_keys) -> None:
    """The message names a position, or starts with a key path (after the source name)."""
    assert len(msg) <= 2000, f"message of {len(msg)} characters: {msg[:300]!r}..."
    if POSITION.search(msg):
        return
    body = msg[len(source) + 2 :] if msg.startswith(source + ": ") else msg
    starts_with_key = body.startswith("(top level)") or any(
        body.startswith(k) and body[len(k) : len(k) + 1] in (".", "[", " ", ",", ":")
        for k in top_keys
    )
    assert starts_with_key, f"names no key path or position: {msg!r}"


def _load(source_arg, source: str, top_keys):
    """config.load: a config, or a ValueError naming the place of every error."""
    try:
        config.load(source_arg, world_size=WORLD, log=False)
    except ValueError as exc:
        for line in _error_lines(exc):
            _check_message(line, source, top_keys)
        return False
    return True


def _check(source_arg, source: str, top_keys, loaded: bool):
    """config_check.check never raises, and agrees with load: what check passes, load accepts."""
    result = config_check.check(source_arg, world_size=WORLD, require_batch=True)
    assert result["ok"] == (not result["errors"])
    for line in result["errors"]:
        _check_message(line, source, top_keys)
    assert not (result["ok"] and not loaded), "config check passed what load rejects"
    return result["ok"]


def _read(text: str):
    """_C.read_json_text: a dict, or a ValueError with the line and column."""
    try:
        tree = _C.read_json_text(text, "fuzz.json")
    except ValueError as exc:
        assert POSITION.search(str(exc)), f"no position: {str(exc)[:300]!r}"
        assert len(str(exc)) <= 2000, str(exc)[:300]
        return None
    assert isinstance(tree, dict)
    return tree


def _python_json(text: str):
    """What Python's json makes of strict JSON text (no NaN, duplicate keys, lone surrogates,
    nor nesting past the reader's 64 levels), ints beyond int64 as floats as the reader keeps
    them; None when the text is outside that."""

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate")
        return dict(pairs)

    def constant(name):
        raise ValueError(name)

    try:
        if text.startswith("\ufeff"):
            text = text[1:]
        tree = json.loads(text, object_pairs_hook=no_duplicates, parse_constant=constant)
    except (ValueError, RecursionError):
        return None

    def norm(v, depth):
        if depth > 64:
            raise OverflowError
        if isinstance(v, bool) or v is None:
            return v
        if isinstance(v, int):
            return v if -(2**63) <= v <= INT64_MAX else float(v)
        if isinstance(v, float) and not math.isfinite(v):
            raise OverflowError  # 1e999: the reader names it instead of reading infinity
        if isinstance(v, str):
            v.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError (a ValueError)
            return v
        if isinstance(v, list):
            return [norm(x, depth + 1) for x in v]
        if isinstance(v, dict):
            return {norm(k, depth + 1): norm(x, depth + 1) for k, x in v.items()}
        return v

    try:
        tree = norm(tree, 1)
    except (OverflowError, ValueError):
        return None
    return tree if isinstance(tree, dict) else None


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _top_keys(tree) -> set:
    return TOP_KEYS | (set(tree) if isinstance(tree, dict) else set())


# --- the cases --------------------------------------------------------------------------------


def _dict_case(i: int):
    rng = random.Random(f"{SEED}:dict:{i}")
    tree, ops = _seed_tree(i), []
    for _ in range(rng.choice([1, 1, 2, 3])):
        _mutate_tree(tree, rng, ops)
    return tree, ops


def _text_case(i: int):
    rng = random.Random(f"{SEED}:text:{i}")
    text, ops = _seed_text(i), []
    for _ in range(rng.choice([1, 1, 2])):
        text = _mutate_text(text, rng, ops)
    return text, ops


def _run_dict(tree, ops):
    start = time.perf_counter()
    loaded = _load(tree, "<dict>", _top_keys(tree))
    _check(tree, "<dict>", _top_keys(tree), loaded)
    took = time.perf_counter() - start
    assert took < CASE_SECONDS, f"{took:.1f} s for {ops}"


def _run_text(text, ops, tmp_path, capsys, cli_mode=None):
    start = time.perf_counter()
    tree = _read(text)
    strict = _python_json(text)
    if strict is not None:
        assert tree is not None, "the reader rejects JSON that Python's json reads"
        assert _same(tree, strict), "the reader and Python's json read different values"
    path = tmp_path / "fuzz.json"
    path.write_text(text, encoding="utf-8")
    keys = _top_keys(tree)
    loaded = _load(str(path), "fuzz.json", keys)
    _check(str(path), "fuzz.json", keys, loaded)
    if cli_mode is not None:
        # `zerostream config check` leaves the batch size to the run (require_batch=False).
        ok = config_check.check(str(path), world_size=WORLD)["ok"]
        argv = ["config", "check", str(path), "--world-size", str(WORLD)]
        rc = cli.main(argv + (["--json"] if cli_mode == "json" else []))
        out = capsys.readouterr().out
        assert rc == (0 if ok else 1)
        if cli_mode == "json":
            assert json.loads(out)["ok"] == ok
    took = time.perf_counter() - start
    assert took < CASE_SECONDS, f"{took:.1f} s for {ops}"


@pytest.mark.parametrize("i", range(N_DICT), ids=lambda i: f"dict-{i:03d}")
def test_mutated_dict(i):
    tree, ops = _dict_case(i)
    try:
        _run_dict(tree, ops)
    except Exception as exc:  # the seed and the mutations say what the case was
        where = f"{SEED_FILES[i % len(SEED_FILES)].name}: {ops}"
        raise AssertionError(f"{where}: {type(exc).__name__}: {exc}") from exc


@pytest.mark.parametrize("i", range(N_TEXT), ids=lambda i: f"text-{i:03d}")
def test_mutated_text(i, tmp_path, capsys):
    text, ops = _text_case(i)
    where = f"{SEED_FILES[i % len(SEED_FILES)].name}: {ops}"
    try:
        _run_text(text, ops, tmp_path, capsys, cli_mode=[None, "json", None, "text"][i % 4])
    except Exception as exc:
        raise AssertionError(f"{where}: {type(exc).__name__}: {exc}") from exc


# --- heavy cases, written out -----------------------------------------------------------------

MEGABYTE = "\u00e9" * 500_000  # a megabyte of UTF-8


def _wide(n: int = 100_000) -> dict:
    return {f"key_{i}": i for i in range(n)}


def _wide_text(n: int = 100_000, last: str = "") -> str:
    return '{"train_batch_size": 4, ' + ", ".join(f'"k{i}": {i}' for i in range(n)) + last + "}"


HEAVY_DICTS = {
    "wide-top-level": lambda: {**_wide(), "train_batch_size": 4},
    "wide-strict-section": lambda: {"train_batch_size": 4, "zero_optimization": _wide()},
    "wide-where-an-int-belongs": lambda: {"train_batch_size": _wide()},
    "wide-optimizer-params": lambda: {
        "train_batch_size": 4,
        "optimizer": {"type": "AdamW", "params": _wide()},
    },
    "wide-pass-through-section": lambda: {"train_batch_size": 4, "amp": _wide()},
    "long-list": lambda: {
        "train_batch_size": 4,
        "optimizer": {"type": "AdamW", "params": {"betas": list(range(100_000))}},
    },
    "megabyte-enum-value": lambda: {
        "train_batch_size": 4,
        "zero_optimization": {"stage": 3, "offload_param": {"device": MEGABYTE}},
    },
    "megabyte-optimizer-type": lambda: {"train_batch_size": 4, "optimizer": {"type": MEGABYTE}},
    "megabyte-keys": lambda: {
        "train_batch_size": 4,
        **{f"{i}{MEGABYTE}": i for i in range(10)},
        "zero_optimization": {MEGABYTE: 1},
    },
}
HEAVY_TEXTS = {
    "wide": lambda: _wide_text(),
    "wide-duplicate-last-key": lambda: _wide_text(last=', "k0": 0'),
    "megabyte-string": lambda: '{"train_batch_size": 4, "fp16": {"enabled": "' + MEGABYTE + '"}}',
    "megabyte-bare-word": lambda: '{"train_batch_size": ' + "x" * 1_000_000 + "}",
    "megabyte-integer": lambda: '{"train_batch_size": ' + "9" * 1_000_000 + "}",
    "megabyte-fraction": lambda: '{"gradient_clipping": 0.' + "1" * 1_000_000 + "}",
    "megabyte-comment": lambda: "/*" + MEGABYTE + '*/ {"train_batch_size": 4}',
    "unterminated-comment": lambda: '{"train_batch_size": 4 /*' + MEGABYTE,
    "unterminated-string": lambda: '{"train_batch_size": "' + MEGABYTE,
    "a-million-lines": lambda: "\n" * 1_000_000 + '{"train_batch_size": 4,',
}


@pytest.mark.parametrize("name", sorted(HEAVY_DICTS))
def test_heavy_dict(name):
    _run_dict(HEAVY_DICTS[name](), name)


@pytest.mark.parametrize("name", sorted(HEAVY_TEXTS))
def test_heavy_text(name, tmp_path, capsys):
    _run_text(HEAVY_TEXTS[name](), name, tmp_path, capsys, cli_mode="json")


# --- deep nesting, in a child process ---------------------------------------------------------

DEEP = 50_000
# Run by a child so that a stack overflow is one failed test, not the end of pytest. Prints one
# JSON line per case before running it and one with the outcome of each entry point after.
CHILD = textwrap.dedent(
    """
    import json, sys
    from zerostream import _C, cli, config, config_check

    def outcome(fn):
        try:
            result = fn()
        except ValueError as exc:
            return ["ValueError", str(exc)[-500:]]
        except BaseException as exc:
            return [type(exc).__name__, str(exc)[-500:]]
        if isinstance(result, dict) and "ok" in result:
            return ["ok" if result["ok"] else "errors", " | ".join(result["errors"])[-500:]]
        return ["ok", ""]

    def deep_dict(depth):
        root = node = {"train_batch_size": 4}
        for _ in range(depth):
            node["a"] = {}
            node = node["a"]
        return root

    for name, path in json.loads(sys.argv[1]):
        print(json.dumps({"start": name}), flush=True)
        if path.startswith("dict:"):
            source = deep_dict(int(path[5:]))
            read = ["skipped", ""]
        else:
            source = path
            with open(path, encoding="utf-8") as f:
                text = f.read()
            read = outcome(lambda: _C.read_json_text(text, "deep.json"))
        results = {
            "read": read,
            "load": outcome(lambda: config.load(source, world_size=2, log=False)),
            "check": outcome(lambda: config_check.check(source, world_size=2)),
        }
        print(json.dumps({"done": name, "results": results}), flush=True)
    """
)
DEEP_TEXTS = {
    "objects": '{"a": ' * DEEP + "1" + "}" * DEEP,
    "lists": '{"a": ' + "[" * DEEP + "]" * DEEP + "}",
    "mixed": '{"a": ' + '[{"b": ' * (DEEP // 2) + "1" + "}]" * (DEEP // 2) + "}",
    "unclosed": "[" * DEEP,
    "in-a-known-section": '{"zero_optimization": {"offload_param": ' + "[" * DEEP,
}
DEEP_CASES = [pytest.param(name, id=f"text-{name}") for name in DEEP_TEXTS] + [
    pytest.param("dict", id="dict-objects")
]


@pytest.fixture(scope="module")
def deep_results(tmp_path_factory):
    """Outcomes of every deep case from one child (an import of torch each would cost more
    than the cases); a case the child died in maps to how it died."""
    folder = tmp_path_factory.mktemp("deep")
    cases = []
    for name, text in DEEP_TEXTS.items():
        path = folder / f"{name}.json"
        path.write_text(text, encoding="utf-8")
        cases.append((name, str(path)))
    cases.append(("dict", f"dict:{DEEP}"))
    import zerostream

    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(zerostream.__file__).parents[1])}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(cases)],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    results, started = {}, None
    for line in proc.stdout.splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        if "start" in event:
            started = event["start"]
        else:
            results[event["done"]] = event["results"]
    if proc.returncode != 0 and started not in results:
        results[started] = f"the child died (exit status {proc.returncode}): {proc.stderr[-2000:]}"
    return results


@pytest.mark.parametrize("name", DEEP_CASES)
def test_deep_nesting_is_an_error_with_its_position(name, deep_results):
    results = deep_results.get(name, "not run: the child died on an earlier case")
    assert isinstance(results, dict), results
    for entry in ("read", "load", "check"):
        kind, msg = results[entry]
        if kind == "skipped":
            continue
        assert kind in ("ValueError", "errors"), f"{entry}: {kind}: {msg}"
        where = "at key path a.a.a" in msg if name == "dict" else POSITION.search(msg)
        assert "nested deeper than 64 levels" in msg and where, f"{entry}: {msg}"


# --- regressions: what the fuzz found ---------------------------------------------------------

REGRESSIONS = [
    # nlohmann's value("enabled", ...) threw its type_error (a RuntimeError) on a string.
    ("enabled-string-in-pass-through", {"curriculum_learning": {"enabled": "."}}, None),
    ("amp-enabled-string", {"amp": {"enabled": "yes"}}, None),
    # A lone surrogate became bytes that are not UTF-8: UnicodeDecodeError or nlohmann's
    # type_error 316 out of load and check.
    (
        "lone-surrogate-in-text",
        '{"aio": {"single_submit": "\\ud800"}}',
        "aio.single_submit: \\u escape \\ud800 is half of a UTF-16 surrogate pair",
    ),
    (
        "lone-surrogate-in-dict",
        {"zero_optimization": {"offload_param": {"nvme_path": "\udfff"}}},
        "zero_optimization.offload_param.nvme_path: \\u escape \\udfff is half",
    ),
    # A high surrogate before a non-surrogate escape was read as one code point (U+11841).
    ("high-surrogate-then-A", '{"comet": {"project": "\\ud83d\\u0041"}}', "\\ud83d is half"),
    # NaN and -Infinity from json.dumps of a dict: "an unfilled template placeholder?" and
    # "malformed number -".
    (
        "nan-in-dict",
        {"gradient_clipping": float("nan")},
        "gradient_clipping: expected a JSON value, got NaN or Infinity",
    ),
    (
        "minus-infinity-in-dict",
        {"gradient_clipping": float("-inf")},
        "gradient_clipping: expected a JSON value, got NaN or Infinity",
    ),
    # Read as infinity, then reported as "expected a finite number; got null".
    (
        "number-beyond-double",
        '{"gradient_clipping": 1e999}',
        "gradient_clipping: number 1e999 is beyond the 64-bit float range",
    ),
    # Python's copy of the message ended at the NUL.
    ("nul-in-key", {"zero_optimization": {"a\x00b": 1}}, "zero_optimization.a\\u0000b: unknown"),
    # The value and the key were quoted whole: megabyte messages.
    ("megabyte-value", {"train_batch_size": "x" * 10**6}, "(1000002 bytes in all)"),
    ("megabyte-key", {"zero_optimization": {"x" * 10**6: 1}}, "(a key of 1000000 bytes): unknown"),
    # The last of many unknown keys was not introduced by a key path.
    (
        "many-unknown-keys",
        {"zero_optimization": {f"bogus_{i}": 1 for i in range(30)}},
        "zero_optimization: more unknown keys than the 20 listed",
    ),
]


@pytest.mark.parametrize("case", REGRESSIONS, ids=[c[0] for c in REGRESSIONS])
def test_regression(case, tmp_path):
    name, body, expected = case
    if isinstance(body, dict):
        source, top = {"train_batch_size": 4, **body}, set(body)
    else:
        source, top = tmp_path / "regression.json", set()
        source.write_text('{"train_batch_size": 4, ' + body[1:], encoding="utf-8")
        source = str(source)
    src_name = "<dict>" if isinstance(source, dict) else "regression.json"
    if expected is None:
        config.load(source, world_size=WORLD, log=False)
    else:
        with pytest.raises(ValueError) as info:
            config.load(source, world_size=WORLD, log=False)
        assert expected in str(info.value)
        for line in _error_lines(info.value):
            _check_message(line, src_name, TOP_KEYS | top)
    _check(source, src_name, TOP_KEYS | top, expected is None)


def test_unknown_megabyte_keys_cost_no_edit_distance():
    """Suggesting a near key compared each unknown key with every schema key by edit distance:
    1.7 s for one megabyte key (a hang for a generated file); keys too long to be a typo are
    skipped now."""
    cfg = {"train_batch_size": 4, **{f"{i}{MEGABYTE}": i for i in range(10)}}
    start = time.perf_counter()
    config.load(cfg, world_size=WORLD, log=False)
    assert time.perf_counter() - start < 2.0

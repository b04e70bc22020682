"""The package's import graph, read from the source (every `import` statement, those inside
functions included, since a lazy import only hides a cycle): no module reaches itself, and
the seams stay cut (checkpoint/ knows neither the engine nor a stage; the config reaches no
optimizer or I/O code; offload/ imports nothing from zero/)."""

import ast
import pathlib
from typing import Dict, List, Set

import zerostream

ROOT = pathlib.Path(zerostream.__file__).parent
PACKAGE = "zerostream"


def _name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in ROOT.rglob("*.py")}


def _targets(module: str, path: pathlib.Path) -> Set[str]:
    """The zerostream modules `module` imports. An import of a name that is not a module
    (`from .. import _C`) is an import of that package's __init__; edges to the module's own
    packages are left out (Python runs them before the module anyway)."""
    out = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            names = [f"{base}.{a.name}" for a in node.names]
            names = [n if n in MODULES else base for n in names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if not name.startswith(PACKAGE):
                continue
            while name not in MODULES and "." in name:
                name = name.rsplit(".", 1)[0]
            if name != module and not module.startswith(name + "."):
                out.add(name)
    return out


GRAPH: Dict[str, Set[str]] = {m: _targets(m, p) for m, p in MODULES.items()}


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _reach(start: str) -> Set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in GRAPH[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def test_the_walk_sees_real_imports():
    """A check that cannot fail is no check: the walk finds edges known to exist."""
    assert "zerostream.zero.stage3.partitioner" in GRAPH["zerostream.zero.stage3.coordinator"]
    assert "zerostream.checkpoint.target" in GRAPH["zerostream.engine.checkpoints"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_itself_through_others():
    assert _cycles(GRAPH) == []


def test_checkpoint_knows_neither_the_engine_nor_a_stage():
    for module in (m for m in MODULES if m.startswith("zerostream.checkpoint")):
        bad = sorted(
            t for t in GRAPH[module] if t.startswith(("zerostream.engine", "zerostream.zero"))
        )
        assert not bad, f"{module} imports {bad}"


def test_the_config_reaches_no_optimizer_or_io_code():
    """Every module of config/ (config_check.py, which builds the optimizer a config names,
    stands above it)."""
    package = [m for m in MODULES if m.startswith("zerostream.config.")]
    assert "zerostream.config.load" in package
    for module in ["zerostream.config"] + package:
        bad = sorted(
            m
            for m in _reach(module)
            if m.startswith(("zerostream.ops", "zerostream.offload"))
            or m in ("zerostream.optim_factory", "zerostream.config_check")
        )
        assert not bad, f"{module} reaches {bad}"


def test_offload_imports_nothing_from_zero():
    """offload/ is the floor the stages stand on (host memory, files, copies, the tiers): a
    piece of it that needs a stage's own types belongs in that stage (stage 3's parameter
    swapper lives in zero/stage3/)."""
    for module in (m for m in MODULES if m.startswith("zerostream.offload")):
        bad = sorted(t for t in GRAPH[module] if t.startswith("zerostream.zero"))
        assert not bad, f"{module} imports {bad}"
    # The rule bites: a stage module that imports offload/ is seen by the same walk.
    assert "zerostream.offload.copy_stage" in GRAPH["zerostream.zero.stage3.param_swap"]


def test_ops_import_from_offload_only_for_deepspeeds_aio_and_pin_handles():
    """ops/ (the CPU and device optimizer kernels, DeepSpeed's optimizer classes) sits below
    offload/, whose tiers step their state with those kernels. The exceptions are
    DeepSpeed's op surfaces for async I/O and pinning, ops/aio.py and ops/pin_memory.py
    (`deepspeed.ops.aio`, the pin_memory op; reached as `zerostream.ops.*` by scripts that
    import zerostream as deepspeed), thin layers over offload's I/O engine and locked
    tensors; the optimizers' aligned state comes from aligned.py, below both."""
    ops = [m for m in MODULES if m.startswith("zerostream.ops")]
    assert "zerostream.ops.adam" in ops
    for module in ops:
        bad = sorted(t for t in GRAPH[module] if t.startswith("zerostream.offload"))
        if module in ("zerostream.ops", "zerostream.ops.aio", "zerostream.ops.pin_memory"):
            continue
        assert not bad, f"{module} imports {bad}"
    assert "zerostream.ops.adam" in GRAPH["zerostream.offload.optimizer_swap"]


def test_the_sizing_module_stands_alone():
    """sizing.py is the one formula of each allocated size (Note [One formula per allocated
    size]): the runtime, the planner and the benches all call it, so it imports nothing of
    zerostream and not torch (the planner runs without torch's import cost)."""
    module = "zerostream.sizing"
    assert GRAPH[module] == set(), GRAPH[module]
    tree = ast.parse(MODULES[module].read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) if n.module}
    assert not {m for m in imported if m.split(".")[0] == "torch"}, imported
    # The rule bites: the stages' users of it are seen by the same walk.
    assert module in GRAPH["zerostream.zero.sharded"]


def test_the_estimator_is_the_model_alone():
    """estimate/ predicts; what measures (runs a training step, starts processes) and
    checks a prediction against the measurement is bench/'s (validate.py, cluster_check.py).
    The planner reads the rates benches left (bench/__init__.py's cache_dir), no bench."""
    for module in (m for m in MODULES if m.startswith("zerostream.estimate")):
        bad = sorted(t for t in GRAPH[module] if t.startswith("zerostream.bench."))
        assert not bad, f"{module} imports {bad}"
    assert "zerostream.estimate.plan" in GRAPH["zerostream.bench.validate"]

"""What installed packages import from `deepspeed`, found by reading their sources.

A file is read only if its text mentions "deepspeed"; it is then parsed, and three kinds of
use are collected, each as a dotted path under `deepspeed` plus how it must resolve:

* `import deepspeed.a.b [as x]`: the module `deepspeed.a.b` must import ("import").
* `from deepspeed.a import b [as x]`: `b` must be an attribute or submodule of
  `deepspeed.a` ("from").
* `x.c.d` where `x` is bound by one of those imports in the same or an enclosing scope:
  `c.d` must be reachable by attribute access alone ("attr"), because the code does not
  import anything more before using it (`import deepspeed; deepspeed.runtime.lr_schedules`).

Strings, comments and attributes of other objects (`self.deepspeed.config`) are not uses.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import pathlib
from typing import Dict, Iterator, List, Optional, Tuple

_SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


@dataclasses.dataclass(frozen=True)
class Use:
    path: str  # dotted, starting with "deepspeed"
    kind: str  # "import", "from" or "attr"
    root: str  # for "attr": the bound path the chain starts from (else == path)
    where: str  # "package/relative/file.py:line"


def package_dir(name: str) -> Optional[pathlib.Path]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def _python_files(root: pathlib.Path) -> Iterator[pathlib.Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith(".py"):
                yield pathlib.Path(dirpath) / name


def _bindings(scope: ast.AST) -> Dict[str, str]:
    """Names that imports directly in `scope` (not in nested scopes) bind to deepspeed paths."""
    out: Dict[str, str] = {}
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, _SCOPES):
            continue
        todo.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "deepspeed":
                    continue
                if alias.asname:
                    out[alias.asname] = alias.name
                else:
                    out["deepspeed"] = "deepspeed"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "deepspeed":
                continue
            for alias in node.names:
                out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return out


def _chain(node: ast.Attribute) -> Optional[Tuple[str, List[str]]]:
    """(root name, [attr, ...]) of `name.a.b`, else None."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return node.id, list(reversed(attrs))


def uses_in_source(text: str, where: str) -> List[Use]:
    tree = ast.parse(text)
    uses: List[Use] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "deepspeed":
                    uses.append(Use(alias.name, "import", alias.name, f"{where}:{node.lineno}"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "deepspeed":
                for alias in node.names:
                    path = f"{node.module}.{alias.name}"
                    uses.append(Use(path, "from", path, f"{where}:{node.lineno}"))

    def visit(scope: ast.AST, inherited: Dict[str, str]) -> None:
        bound = {**inherited, **_bindings(scope)}
        todo = list(ast.iter_child_nodes(scope))
        while todo:
            node = todo.pop()
            if isinstance(node, _SCOPES):
                visit(node, bound)
                continue
            if isinstance(node, ast.Attribute):
                chain = _chain(node)
                if chain is not None and chain[0] in bound:
                    root = bound[chain[0]]
                    path = ".".join([root] + chain[1])
                    uses.append(Use(path, "attr", root, f"{where}:{node.lineno}"))
                    continue  # the inner Attribute nodes are prefixes of this chain
            todo.extend(ast.iter_child_nodes(node))

    visit(tree, {})
    return uses


def scan(
    packages=("transformers", "accelerate", "pytorch_lightning", "lightning_fabric"),
) -> List[Use]:
    """Every use of `deepspeed` in the installed sources of `packages`."""
    uses: List[Use] = []
    for name in packages:
        root = package_dir(name)
        if root is None:
            raise RuntimeError(f"{name} is not installed")
        for path in _python_files(root):
            text = path.read_text(encoding="utf-8", errors="replace")
            if "deepspeed" not in text:
                continue
            rel = f"{name}/{path.relative_to(root).as_posix()}"
            uses.extend(uses_in_source(text, rel))
    return uses

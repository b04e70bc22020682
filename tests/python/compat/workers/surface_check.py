"""Resolves import_surface uses against the installed `deepspeed` (run in a subprocess).

argv: a JSON file of [[path, kind, root], ...]; prints {path: "ok" | "refused: ..." |
"missing: ..."}. Attribute chains are resolved right after `import deepspeed` and before any
other import, by getattr alone, as the code using them does.
"""

import importlib
import json
import sys


def _module_or_attribute(path: str):
    """What `from a.b import c` (path a.b.c) or `import a.b.c` gives."""
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as exc:
        if exc.name != path:
            raise
    parent, _, name = path.rpartition(".")
    module = importlib.import_module(parent)
    if not hasattr(module, name):
        raise AttributeError(f"module {parent!r} has no attribute {name!r}")
    return getattr(module, name)


def _resolve(path: str, kind: str, root: str):
    if kind == "import":
        return importlib.import_module(path)
    if kind == "from":
        return _module_or_attribute(path)
    obj = _module_or_attribute(root)
    for part in path[len(root) + 1 :].split("."):
        obj = getattr(obj, part)
    return obj


def main() -> None:
    with open(sys.argv[1]) as f:
        uses = json.load(f)
    import deepspeed
    from deepspeed._unsupported import RefusedOnUse, UnsupportedFeatureError

    assert deepspeed  # imported first on purpose: the attribute chains see only its own work
    # Chains on `import deepspeed` first: nothing else has been imported yet.
    uses.sort(key=lambda u: (u[1] != "attr" or u[2] != "deepspeed", u[1], u[0]))
    out = {}
    for path, kind, root in uses:
        try:
            obj = _resolve(path, kind, root)
            if isinstance(obj, type) and issubclass(obj, RefusedOnUse):
                obj()  # importable, refused when built
            out[path] = "ok"
        except UnsupportedFeatureError as exc:
            out[path] = f"refused: {exc}"
        except Exception as exc:  # what the test reports: anything that does not resolve
            out[path] = f"missing: {type(exc).__name__}: {exc}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()

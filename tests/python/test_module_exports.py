"""zerostream._C exports PyInit__C and nothing else.

Any other dynamic symbol can interpose: an exported copy of a std:: template or of
nlohmann::json in _C can be bound to torch's build of it (or the reverse) when both are
loaded, and two libstdc++ builds' inline code mixing has crashed the process. The build
hides everything else (hidden visibility, --exclude-libs, a version script); this pins it.
"""

import os
import shutil
import subprocess

import pytest

from zerostream import _C

# Symbols some linkers define in every shared object; tolerated, never required.
LINKER_SYMBOLS = {"_init", "_fini", "__bss_start", "_edata", "_end"}


def _exported_symbols(path: str, demangle: bool = False) -> list:
    """(type, name) of every defined symbol in the dynamic symbol table of `path`."""
    cmd = ["nm", "-D", "--defined-only"] + (["-C"] if demangle else []) + [path]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    symbols = []
    for line in out.splitlines():
        fields = line.split(maxsplit=2)  # address, type, name (demangled names have spaces)
        if len(fields) == 3:
            symbols.append((fields[1], fields[2]))
    return symbols


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) is not installed")
def test_only_pyinit_is_exported():
    path = _C.__file__
    names = [name for _, name in _exported_symbols(path)]
    assert "PyInit__C" in names, f"{path} does not export PyInit__C"
    extra = [n for n in names if n != "PyInit__C" and n not in LINKER_SYMBOLS]
    if extra:
        shown = [
            f"{kind} {name}"
            for kind, name in _exported_symbols(path, demangle=True)
            if name != "PyInit__C" and name not in LINKER_SYMBOLS
        ]
        listing = "\n  ".join(shown[:60]) + ("\n  ..." if len(shown) > 60 else "")
        pytest.fail(
            f"{path} exports {len(extra)} symbols besides PyInit__C "
            f"(nm -D --defined-only):\n  {listing}"
        )


@pytest.mark.skipif(
    not os.environ.get("ZS_LOAD_C_FROM"),
    reason="the -static-libstdc++ variant runs only "
    "under scripts/test.sh (ZS_LOAD_C_FROM, see tests/python/conftest.py)",
)
def test_the_session_runs_the_static_libstdcxx_variant_after_torch():
    """The GPU box's compiler wrapper linked libstdc++ into _C statically; with torch loaded
    first, formatting a config error crashed the process (GPU data-path issue). This pytest
    session loaded such a build after torch (conftest.py); the config tests running beside this
    one are the check. Here: it really is that build."""
    import sys

    assert "torch" in sys.modules
    assert os.path.samefile(_C.__file__, os.environ["ZS_LOAD_C_FROM"])
    needed = subprocess.run(["ldd", _C.__file__], capture_output=True, text=True).stdout
    assert "libstdc++" not in needed, f"{_C.__file__} links libstdc++ dynamically:\n{needed}"
    assert [name for _, name in _exported_symbols(_C.__file__)] == ["PyInit__C"]

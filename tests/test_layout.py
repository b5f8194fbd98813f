"""The package's layout rules (issue 13), checked on every run:

- no submodule ``a.b.c`` is hidden behind an attribute ``c`` of package
  ``a.b`` that is something else (``spmdnet.tensor`` is the factory function,
  so the Tensor class lives in ``spmdnet._tensor``);
- ``spmdnet.dist`` is only an alias of ``spmdnet.distributed``;
- ``import spmdnet`` starts no MPI, and math (autograd, ops, nn, optim) and
  the layers above the runtime import mpi4py only through ``dist.mpi()``;
- no package file is longer than 400 lines.
"""
import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import spmdnet

PACKAGE_DIR = Path(spmdnet.__file__).parent
MAX_LINES = 400


def _submodules():
    for info in pkgutil.walk_packages(spmdnet.__path__, "spmdnet."):
        if info.name.rpartition(".")[2] != "__main__":  # running it is its only use
            yield info.name


def _package_files():
    return sorted(p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_submodule_is_shadowed_by_a_package_attribute():
    shadowed = []
    for name in _submodules():
        module = importlib.import_module(name)
        parent, _, leaf = name.rpartition(".")
        attribute = getattr(sys.modules[parent], leaf)
        if attribute is not module:
            shadowed.append(f"{name}: {parent}.{leaf} is {attribute!r}")
    assert not shadowed, "rename the module or the attribute:\n" + "\n".join(shadowed)


def test_the_walk_sees_every_package_file():
    walked = set(_submodules()) | {"spmdnet"}
    for path in _package_files():
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        assert name in walked or parts[-1] == "__main__", f"{path} is not a walked module"


def test_dist_is_an_alias_of_distributed():
    assert spmdnet.dist is spmdnet.distributed is importlib.import_module("spmdnet.distributed")
    assert not (PACKAGE_DIR / "dist").exists(), "spmdnet/dist/ must not come back"


def test_import_spmdnet_starts_no_mpi():
    code = ("import sys, spmdnet; from spmdnet import dist, parallel, data; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mpi4py'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def _imports_mpi4py(path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "mpi4py"
                                                for a in node.names):
            return node.lineno
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mpi4py":
            return node.lineno
    return None


@pytest.mark.parametrize("subpackage", ["autograd", "ops", "nn", "optim", "kernels",
                                        "parallel", "data"])
def test_mpi4py_is_imported_only_by_the_distributed_package(subpackage):
    found = [f"{p.relative_to(PACKAGE_DIR.parent)}:{line}"
             for p in sorted((PACKAGE_DIR / subpackage).rglob("*.py"))
             if (line := _imports_mpi4py(p)) is not None]
    assert not found, f"use spmdnet.distributed (dist.mpi() for constants): {found}"


def test_no_package_file_exceeds_the_line_budget():
    long = [f"{p.relative_to(PACKAGE_DIR.parent)}: {n} lines" for p in _package_files()
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"split these files (at most {MAX_LINES} lines each): {long}"

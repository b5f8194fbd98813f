"""The package's layout rules, checked on every run:

- no submodule ``a.b.c`` is hidden behind an attribute ``c`` of package
  ``a.b`` that is something else (``spmdnet.tensor`` is the factory function,
  so the Tensor class lives in ``spmdnet._tensor``);
- ``spmdnet.dist`` is only an alias of ``spmdnet.distributed``;
- ``import spmdnet`` starts no MPI, and math (autograd, ops, nn, optim) and
  the layers above the runtime import mpi4py only through ``dist.mpi()``;
- no package file is longer than 400 lines;
- every module has a layer, no import goes up a layer (imports
  inside functions count; EXEMPTIONS names each PyTorch path that sits below
  its implementation), and no modules import each other in a circle.
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


# -- the layer order (docs/ARCHITECTURE.md) --------------------------
# A module imports only from its own layer or below. Modules are placed by the
# longest matching dotted prefix, so files moving inside a layer need no edit
# here; a module no prefix places fails test_every_module_has_a_layer.
# Layers with the same height but different names (strategies and data) do not
# import each other. The package facade (spmdnet/__init__.py) imports the
# layers below it and nothing imports it, except the tools: programs run with
# `python -m` that use the public API as examples/ and benchmarks/ do.
LAYERS = {
    "leaves": 0, "tensor": 1, "autograd": 2, "kernels": 3, "ops": 4, "nn": 5, "optim": 6,
    "distributed": 7, "strategies": 8, "data": 8, "state": 9, "package": 10, "tools": 11,
}
PLACES = {
    "spmdnet": "package",  # the public facade imports everything; nothing imports it
    **dict.fromkeys(["spmdnet.config", "spmdnet.errors", "spmdnet.backend", "spmdnet.launch",
                     "spmdnet.host_memory", "spmdnet.version", "spmdnet.dtypes",
                     "spmdnet._precision", "spmdnet._args", "spmdnet._owned_storage"],
                    "leaves"),
    "spmdnet._tensor": "tensor",
    "spmdnet.autograd": "autograd",
    "spmdnet.kernels": "kernels",
    **dict.fromkeys(["spmdnet.ops", "spmdnet.random", "spmdnet.creation"], "ops"),
    "spmdnet.nn": "nn",
    "spmdnet.functional": "nn",  # a second name of spmdnet.nn.functional
    "spmdnet.optim": "optim",
    "spmdnet.distributed": "distributed",
    **dict.fromkeys(["spmdnet.multiprocessing", "spmdnet.run"], "distributed"),
    "spmdnet.parallel": "strategies",
    # PyTorch's paths of the strategies' implementations and adapters
    **dict.fromkeys(["spmdnet.nn.parallel.distributed", "spmdnet.distributed.fsdp",
                     "spmdnet.distributed.optim"], "strategies"),
    # FSDP2's DTensor and mesh sit on the runtime; its state_dict helpers see every wrapper
    **dict.fromkeys(["spmdnet.distributed.tensor", "spmdnet.distributed.device_mesh"],
                    "distributed"),
    "spmdnet.distributed.checkpoint": "strategies",
    **dict.fromkeys(["spmdnet.utils", "spmdnet.utils.data", "spmdnet.data"], "data"),
    **dict.fromkeys(["spmdnet.checkpoint", "spmdnet.profiler"], "state"),
    **{"spmdnet._device": "leaves", "spmdnet._compile": "leaves", "spmdnet.backends": "leaves",
       "spmdnet.cuda": "ops", "spmdnet.amp": "ops", "spmdnet.accelerator": "ops",
       "spmdnet.serialization": "state"},  # devices, amp, save/load
    **dict.fromkeys(["spmdnet.cli", "spmdnet.bench"], "tools"),
    "spmdnet._tensor_str": "leaves",  # PyTorch's repr text (torch/_tensor_str.py)
    "spmdnet._meta": "leaves",  # the meta device's shape-only arrays (_device re-exports)
}
# (importer prefix, imported prefix, why): PyTorch paths that sit lower in
# PyTorch's tree than their implementation, reached lazily or by thin modules.
EXEMPTIONS = []


def _module_name(path):
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name):
    base = PACKAGE_DIR.parent.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or base.is_dir()


def _imported_modules(node, package):
    """The spmdnet modules an import statement loads: relative imports resolved
    against ``package``; ``from p import n`` is module p.n when that is a
    module, else p."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            parts = package.split(".")
            parts = parts[:len(parts) - node.level + 1] + ([node.module] if node.module else [])
            base = ".".join(parts)
        else:
            base = node.module or ""
        names = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base
                 for a in node.names]
    return [n for n in names if n.split(".")[0] == "spmdnet"]


def _import_graph():
    """(importer, imported, "file:line", lazy) for every import of a spmdnet
    module in the package, at module level or inside a function."""
    edges = []
    for path in _package_files():
        me = _module_name(path)
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        in_functions = {id(n) for f in ast.walk(tree)
                        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                        for n in ast.walk(f)}
        where = path.relative_to(PACKAGE_DIR.parent)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges += [(me, target, f"{where}:{node.lineno}", id(node) in in_functions)
                          for target in _imported_modules(node, package)]
    return edges


def _within(name, prefix):
    return name == prefix or name.startswith(prefix + ".")


def _place(name):
    if name == "spmdnet":
        return PLACES[name]
    matches = [p for p in PLACES if p != "spmdnet" and _within(name, p)]
    return PLACES[max(matches, key=len)] if matches else None


def _exempt(importer, imported):
    return any(_within(importer, a) and _within(imported, b) for a, b, _ in EXEMPTIONS)


def test_every_module_has_a_layer():
    unplaced = sorted({_module_name(p) for p in _package_files()
                       if _place(_module_name(p)) is None})
    assert not unplaced, f"add these modules to PLACES in tests/test_layout.py: {unplaced}"


def test_every_exemption_says_why_and_is_used():
    assert all(len(why) > 20 for _, _, why in EXEMPTIONS)
    modules = {_module_name(p) for p in _package_files()}
    edges = [(a, b) for a, b, _, _ in _import_graph()]
    stale = [(a, b) for a, b, _ in EXEMPTIONS
             if any(_within(m, a) for m in modules)
             and not any(_within(x, a) and _within(y, b) for x, y in edges)]
    assert not stale, f"remove these exemptions from EXEMPTIONS, nothing needs them: {stale}"


def test_no_import_goes_up_a_layer():
    upward = []
    for importer, imported, where, lazy in sorted(set(_import_graph())):
        low, high = _place(imported), _place(importer)
        if low is None or high is None or _exempt(importer, imported):
            continue  # unplaced modules fail test_every_module_has_a_layer
        if LAYERS[low] > LAYERS[high] or (LAYERS[low] == LAYERS[high] and low != high):
            upward.append(f"{where}: {importer} ({high}) imports {imported} ({low})"
                          + (" inside a function" if lazy else ""))
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def _cycles(edges):
    """The strongly connected components of more than one module (Tarjan)."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on_stack, found = {}, {}, [], set(), []

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
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_modules_import_each_other_in_a_circle():
    """No import cycle anywhere in the package, counting imports inside
    functions too (creation.py and ops/ share argument parsers through
    _args.py instead of importing each other).
    Importing a package's module runs the package's __init__.py first, so
    that is an arrow too, to what that file imports as it runs ("P (running)":
    its top-level imports; a name it resolves on first access, as
    spmdnet.parallel's, is imported by whoever reads it); a module reaching its
    own package is not."""
    graph = _import_graph()
    edges = [(f"{a} (running)", b) for a, b, _, lazy in graph if not lazy]
    for importer, imported, _, _ in graph:  # exempt arrows count too
        parts = imported.split(".")
        edges += [(importer, ".".join(parts[:n]) + ("" if n == len(parts) else " (running)"))
                  for n in range(2, len(parts) + 1) if not _within(importer, ".".join(parts[:n]))]
    assert not _cycles(edges), f"import cycles: {_cycles(edges)}"


def test_parallel_loads_nothing_and_names_the_pytorch_paths_objects():
    """spmdnet.parallel's __init__ imports nothing as it runs (the data-parallel
    and ZeRO modules import its _common); each name resolves on first access to
    the one object defined at PyTorch's path."""
    top = [b for a, b, _, lazy in _import_graph() if a == "spmdnet.parallel" and not lazy]
    assert top == [], f"spmdnet/parallel/__init__.py imports {top} as it loads"
    parallel = importlib.import_module("spmdnet.parallel")
    ddp = importlib.import_module("spmdnet.nn.parallel.distributed")
    zero = importlib.import_module("spmdnet.distributed.optim")
    assert parallel.DataParallel is parallel.DistributedDataParallel is ddp.DistributedDataParallel
    assert spmdnet.nn.parallel.DistributedDataParallel is ddp.DistributedDataParallel
    assert parallel.allreduce_gradients is ddp.allreduce_gradients
    assert parallel.ZeroRedundancyOptimizer is zero.ZeroRedundancyOptimizer
    assert set(parallel.__all__) <= set(dir(parallel))
    assert all(getattr(parallel, name) is not None for name in parallel.__all__)
    with pytest.raises(AttributeError, match="no attribute 'data_parallel'"):
        parallel.data_parallel  # noqa: B018 - the access is the test


def test_creation_and_ops_do_not_import_each_other():
    edges = {(a, b) for a, b, _, _ in _import_graph()}
    ops_modules = {b for _, b in edges if _within(b, "spmdnet.ops")}
    to_ops = [b for a, b in edges if a == "spmdnet.creation" and b in ops_modules]
    assert not to_ops, f"creation.py imports {to_ops}: take the parser from spmdnet._args"

"""The import graph of the package, read with `ast` (stdlib only): arrows point down and never in a circle.

Every import statement counts — module level, inside functions (lazy) and under `TYPE_CHECKING` — because a
cycle hidden behind a lazy import is still a cycle in the design. The layers (DESIGN.md):

    cli -> gui -> {batch, catalog} -> core -> errors

and inside `vitviz.core`, one subpackage per stage of the data's flow, each importing only its own stage and the
stages before it:

    drawing -> analyses -> running -> reading -> core's own modules (options, spec, files, ... shared records)
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "vitviz"


def module_names(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted name -> file for every module of the package (packages named by their `__init__`)."""
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_edges(root: Path = PACKAGE) -> dict[str, dict[str, set[str]]]:
    """importer -> {imported vitviz module -> kinds ('top', 'lazy', 'type-only')}.

    `from a.b import c` counts as importing `a.b.c` when that is a module, else `a.b`; importing a submodule
    also imports its parent packages, but those edges are what Python does, not a design choice, so only the
    named module is recorded.
    """
    mods = module_names(root)
    edges: dict[str, dict[str, set[str]]] = {m: {} for m in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        type_only = {id(n) for node in ast.walk(tree)
                     if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                     for n in ast.walk(node)}
        lazy = {id(n) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                for n in ast.walk(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = _resolve(name, path.name == "__init__.py", node)
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            kind = "type-only" if id(node) in type_only else "lazy" if id(node) in lazy else "top"
            for t in targets:
                if t in mods and t != name:
                    edges[name].setdefault(t, set()).add(kind)
    return edges


def find_cycles(edges: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_import_cycles() -> None:
    cycles = find_cycles(import_edges())
    assert not cycles, "import cycles (lazy and type-only imports count): " + "; ".join(" <-> ".join(c) for c in cycles)


def test_core_imports_nothing_above_it() -> None:
    bad = [(a, b) for a, targets in import_edges().items() if _layer(a) == "core"
           for b in targets if _layer(b) in ("gui", "cli", "batch", "catalog", "demo")]
    assert not bad, f"vitviz.core must not import gui/cli/batch/catalog/demo: {bad}"


STAGES = ("reading", "running", "analyses", "drawing")   # in the order the data flows; core's own modules come first


def _stage(module: str) -> int:
    """0 for a module of `vitviz.core` itself (the shared records), else 1 + the index of its stage."""
    parts = module.split(".")
    return STAGES.index(parts[2]) + 1 if len(parts) > 3 and parts[2] in STAGES else 0


def test_core_stages_import_only_downward() -> None:
    edges = import_edges()
    core = [m for m in edges if _layer(m) == "core"]
    unstaged = [m for m in core if m.count(".") >= 2 and _stage(m) == 0 and m.count(".") > 2]
    assert not unstaged, f"modules below vitviz.core outside a stage: {unstaged}"
    bad = [(a, b) for a in core for b in edges[a] if _layer(b) == "core" and _stage(b) > _stage(a)]
    assert not bad, "a stage of vitviz.core imports a later stage (" + " -> ".join(STAGES) + "): " + \
        "; ".join(f"{a} -> {b}" for a, b in bad)


def test_the_stage_check_can_fail() -> None:
    """The rule itself: reading importing drawing is refused, drawing importing reading is not."""
    assert _stage("vitviz.core.reading.checkpoint") < _stage("vitviz.core.drawing.render")
    assert _stage("vitviz.core.spec") == 0 and _stage("vitviz.core.reading.families.timm") == 1
    assert _stage("vitviz.core.running.live.record") == 2


def test_batch_and_catalog_import_only_core() -> None:
    bad = [(a, b) for a, targets in import_edges().items() if _layer(a) in ("batch", "catalog")
           for b in targets if _layer(b) in ("gui", "cli") or (_layer(b) in ("batch", "catalog") and
                                                              _layer(b) != _layer(a))]
    assert not bad, f"batch and catalog sit on core only: {bad}"


def test_gui_never_imports_cli_nor_torch_at_module_level() -> None:
    edges = import_edges()
    bad = [(a, b) for a, targets in edges.items() if _layer(a) == "gui" for b in targets if _layer(b) == "cli"]
    assert not bad, f"vitviz.gui must not import vitviz.cli: {bad}"
    torch_top = []
    for name, path in module_names().items():
        if _layer(name) != "gui":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:   # module level only; imports inside functions run on the worker
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            torch_top += [f"{name}: {n}" for n in names if n.split(".")[0] in ("torch", "torchvision")]
    assert not torch_top, f"torch imported at module level of the GUI: {torch_top}"


def test_the_checker_sees_lazy_and_type_only_cycles(tmp_path: Path) -> None:
    """The graph reader itself: a lazy import and a TYPE_CHECKING import close a cycle."""
    pkg = tmp_path / "vitviz"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from vitviz.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import a\n")
    edges = import_edges(pkg)
    assert edges["vitviz.a"] == {"vitviz.sub.b": {"lazy"}}
    assert edges["vitviz.sub.b"] == {"vitviz.a": {"type-only"}}
    assert find_cycles(edges) == [["vitviz.a", "vitviz.sub.b"]]

"""No import cycles among rlm's modules (docs/architecture.md §1): inside a package, as between the
layers, imports point one way, so a module can be read, imported and tested without the modules
that import it. Measured with grimp (the graph lint-imports checks), counting every import — at the
top, inside a function, under ``TYPE_CHECKING`` (a circle only mypy sees still makes two modules
that cannot be understood apart).

The tiering engine is covered too: its rooms (docs/architecture.md §1.1) import each other one
way by their own contract, and no two modules inside a room import each other. grimp reads ``.py``
files only, so ``from pkg import _ext`` of a compiled extension (a ``.pyi`` stub with no ``.py``)
looks like an import of ``pkg`` itself; such imports are pointed at the extension before cycles
are counted."""

from __future__ import annotations

import ast
import importlib.util
import itertools
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[2]


def _extension_modules() -> set[str]:
    """Compiled modules of rlm: a ``.pyi`` stub without a ``.py`` beside it."""
    return {
        ".".join(stub.relative_to(REPO).with_suffix("").parts)
        for stub in (REPO / "rlm").rglob("*.pyi")
        if not stub.with_suffix(".py").exists()
    }


def _extension_named(line: str, package: str, extensions: set[str]) -> str | None:
    """The extension ``line`` imports when it is ``from <package> import <extension>``, else None
    (any other line, or one grimp cut short, stays an import of ``package``)."""
    try:
        node = ast.parse(line.strip()).body[0]
    except (SyntaxError, IndexError):
        return None
    if not (isinstance(node, ast.ImportFrom) and node.module == package and len(node.names) == 1):
        return None
    name = f"{package}.{node.names[0].name}"
    return name if name in extensions else None


def point_at_extensions(graph: grimp.ImportGraph, extensions: set[str]) -> None:
    """Re-point each import of a package that only names one of its compiled extensions."""
    for extension in sorted(extensions):
        package = extension.rpartition(".")[0]
        graph.add_module(extension)
        for importer in sorted(graph.find_modules_that_directly_import(package)):
            details = graph.get_import_details(importer=importer, imported=package)
            named = [_extension_named(d["line_contents"], package, extensions) for d in details]
            if named and all(named):
                graph.remove_import(importer=importer, imported=package)
                for d, target in zip(details, named, strict=True):
                    graph.add_import(
                        importer=importer,
                        imported=target,
                        line_number=d["line_number"],
                        line_contents=d["line_contents"],
                    )


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The groups of modules that import each other (strongly connected, more than one module),
    each sorted."""
    found: list[list[str]] = []
    seen: set[str] = set()
    for module in sorted(graph.modules):
        if module in seen:
            continue
        group = graph.find_upstream_modules(module) & graph.find_downstream_modules(module)
        if group:
            seen |= group | {module}
            found.append(sorted(group | {module}))
    return found


def chain(graph: grimp.ImportGraph, group: list[str]) -> str:
    """A shortest cycle through ``group[0]``, each module with the line that imports the next:
    ``a:12 → b:40 → a``."""
    start = group[0]
    routes = [
        graph.find_shortest_chain(importer=n, imported=start)
        for n in graph.find_modules_directly_imported_by(start)
        if n in group
    ]
    loop = (start, *min((r for r in routes if r), key=len))
    steps = [
        f"{a}:{min(d['line_number'] for d in graph.get_import_details(importer=a, imported=b))}"
        for a, b in itertools.pairwise(loop)
    ]
    return " → ".join([*steps, start])


def _rlm_graph() -> grimp.ImportGraph:
    graph = grimp.build_graph("rlm", cache_dir=None)
    point_at_extensions(graph, _extension_modules())
    return graph


def test_the_check_reads_this_tree() -> None:
    spec = importlib.util.find_spec("rlm")
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).parent == REPO / "rlm", f"grimp would read {spec.origin}, not this tree"
    graph = _rlm_graph()
    assert len(graph.modules) > 200 and "rlm.storage.api" in graph.modules, len(graph.modules)
    assert {"rlm.formats.records._columns", "rlm.formats.records._scan"} <= _extension_modules()


def test_no_import_cycles() -> None:
    graph = _rlm_graph()
    found = [chain(graph, group) for group in cycles(graph)]
    assert not found, (
        "import cycles (module:line that imports the next); move what both sides need into a leaf "
        "module (docs/architecture.md §1):\n" + "\n".join(found)
    )


def _graph(*imports: tuple[str, str, int, str]) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    for importer, imported, line, text in imports:
        graph.add_module(importer)
        graph.add_module(imported)
        graph.add_import(importer=importer, imported=imported, line_number=line, line_contents=text)
    return graph


def test_a_cycle_is_reported_with_its_chain() -> None:
    graph = _graph(
        ("rlm.s.api", "rlm.s.retry", 50, "from rlm.s.retry import RetryPolicy"),
        ("rlm.s.retry", "rlm.s.wrapper", 35, "from rlm.s.wrapper import WrappingBackend"),
        ("rlm.s.wrapper", "rlm.s.api", 12, "from rlm.s.api import StorageBackend"),
        ("rlm.s.retry", "rlm.s.api", 34, "from rlm.s.api import StorageBackend"),
        ("rlm.tiering.a", "rlm.tiering.b", 1, "from rlm.tiering.b import x"),
        ("rlm.tiering.b", "rlm.tiering.a", 2, "from rlm.tiering.a import y"),
        ("rlm.jobs.j", "rlm.tiering.a", 3, "from rlm.tiering.a import y"),
    )
    assert cycles(graph) == [
        ["rlm.s.api", "rlm.s.retry", "rlm.s.wrapper"],
        ["rlm.tiering.a", "rlm.tiering.b"],
    ]
    assert (
        chain(graph, ["rlm.s.api", "rlm.s.retry", "rlm.s.wrapper"])
        == "rlm.s.api:50 → rlm.s.retry:34 → rlm.s.api"
    )


def test_an_import_of_a_compiled_extension_is_not_one_of_its_package() -> None:
    graph = _graph(
        ("rlm.f", "rlm.f.choice", 51, "from rlm.f.choice import decode"),
        ("rlm.f.choice", "rlm.f", 21, "from rlm.f import _columns"),
    )
    point_at_extensions(graph, {"rlm.f._columns"})
    assert cycles(graph) == []
    assert graph.direct_import_exists(importer="rlm.f.choice", imported="rlm.f._columns")
    graph.add_import(
        importer="rlm.f.choice", imported="rlm.f", line_number=30, line_contents="from rlm.f import helper"
    )
    point_at_extensions(graph, {"rlm.f._columns"})
    assert cycles(graph) == [["rlm.f", "rlm.f.choice"]]  # a real import of the package still counts

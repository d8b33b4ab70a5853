"""The size rules of CONTRIBUTING.md, checked over every Python file of the repo (rlm, the plugins,
tests, bench): a module of at most 500 lines, a function of at most 60 (after ``ruff format``,
decorators excluded, nested functions counted inside their parent and on their own)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("rlm", "plugins", "tests", "bench")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _python_files() -> Iterator[Path]:
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if not any(part.startswith(".") or part in ("build", "__pycache__") for part in path.parts):
                yield path


def _long_functions(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                yield f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines} lines"


def test_the_check_sees_the_whole_repo() -> None:
    files = list(_python_files())
    assert len(files) > 300 and any(p.name == "manager.py" for p in files), len(files)


def test_no_module_is_longer_than_500_lines() -> None:
    too_long = [
        f"{p.relative_to(REPO)}: {n} lines"
        for p in _python_files()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not too_long, "split by responsibility (CONTRIBUTING.md):\n" + "\n".join(too_long)


def test_no_function_is_longer_than_60_lines() -> None:
    too_long = [line for p in _python_files() for line in _long_functions(p)]
    assert not too_long, "split into named steps (CONTRIBUTING.md):\n" + "\n".join(too_long)

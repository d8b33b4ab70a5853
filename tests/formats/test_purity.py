"""rlm.formats does no I/O (docs/architecture.md §1): what import-linter cannot see.

The contract "rlm.formats stays pure" (pyproject.toml) forbids the I/O and network modules by name.
It cannot forbid part of a module, and formats needs three standard ones: ``os`` for the decoder/
scan choice (``os.environ``) and AEAD nonces (``os.urandom``), ``mmap`` for the type of the buffers
its callers map, ``sys`` for constants. This walks every formats module's syntax tree and fails on
any other use of them, and on the builtins that reach files or the terminal.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rlm.formats

FORMATS = Path(rlm.formats.__file__).parent
MODULES = sorted(FORMATS.rglob("*.py"))

#: module -> the attributes formats may touch (everything else is I/O or process state).
ALLOWED_ATTRIBUTES = {
    "os": {"environ", "urandom"},
    "mmap": {"mmap"},
    "sys": {"byteorder", "maxsize"},
}
#: Builtins that open files or talk to the terminal.
FORBIDDEN_CALLS = {"open", "print", "input", "breakpoint"}


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ALLOWED_ATTRIBUTES:
            # `from os import path` would escape the attribute check below.
            found += [f"line {node.lineno}: from {node.module} import {a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            allowed = ALLOWED_ATTRIBUTES.get(node.value.id)
            if allowed is not None and node.attr not in allowed:
                found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS
        ):
            found.append(f"line {node.lineno}: {node.func.id}()")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and (node.func.value.id, node.func.attr) == ("mmap", "mmap")
        ):
            found.append(f"line {node.lineno}: mmap.mmap() maps a file")
    return sorted(found, key=lambda v: int(v.split(":")[0].removeprefix("line ")))


def test_formats_modules_are_found() -> None:
    # Guards the parametrisation below against an empty walk passing vacuously.
    assert FORMATS / "records" / "decode.py" in MODULES
    assert len(MODULES) > 10


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(FORMATS)))
def test_formats_module_does_no_io(path: Path) -> None:
    assert _violations(path) == []


def test_the_check_catches_io(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os, mmap\nfrom os import path\n"
        "def f(p):\n    os.remove(p)\n    m = mmap.mmap(-1, 4)\n    return open(p).read()\n",
        encoding="utf-8",
    )
    assert _violations(bad) == [
        "line 2: from os import path",
        "line 4: os.remove",
        "line 5: mmap.mmap() maps a file",
        "line 6: open()",
    ]

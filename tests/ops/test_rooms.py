"""The rooms of the tiering engine and of the jobs keep their faces (docs/architecture.md §1.1).

Code outside a room imports it through the room's package (``from rlm.tiering.read import
TieredReaders``, or a module object: ``from rlm.tiering.store import object_keys``), never ``from
rlm.tiering.read.readers import ...``: what a room exposes is what its ``__init__`` names, so its
modules can be split or merged without touching other packages. Tests may reach inside. The order
of the rooms is the import-linter contracts "tiering rooms" and "jobs rooms" in pyproject.toml.
"""

from __future__ import annotations

import copy
import re
from functools import cache

import grimp

#: Each package with rooms → its rooms.
ROOMS = {
    "tiering": ("store", "local", "converge", "copy", "expire", "read"),
    "jobs": ("reading", "tables", "checks", "restore"),
}


@cache
def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("rlm")


def _room_of(module: str) -> str | None:
    """``rlm.<package>.<room>`` of a module inside a room (not the room's face itself), else None."""
    parts = module.split(".")
    if len(parts) > 3 and parts[0] == "rlm" and parts[2] in ROOMS.get(parts[1], ()):
        return ".".join(parts[:3])
    return None


def _face_violations(graph: grimp.ImportGraph) -> list[str]:
    found = []
    for imported in sorted(m for m in graph.modules if _room_of(m)):
        room = _room_of(imported)
        face = re.compile(rf"^\s*from {re.escape(str(room))} import ")
        for importer in sorted(graph.find_modules_that_directly_import(imported)):
            if _room_of(importer) == room or importer == room:
                continue
            for detail in graph.get_import_details(importer=importer, imported=imported):
                if not face.match(detail["line_contents"]):
                    found.append(f"{importer}:{detail['line_number']}: {detail['line_contents']}")
    return found


def test_every_room_has_a_face_naming_what_it_exports() -> None:
    import importlib

    for package, rooms in ROOMS.items():
        for room in rooms:
            module = importlib.import_module(f"rlm.{package}.{room}")
            assert module.__doc__ and "public face" in module.__doc__, room
            exported = getattr(module, "__all__", None)
            assert exported, f"rlm.{package}.{room} names no public face (__all__)"
            assert all(hasattr(module, name) for name in exported), room


def test_code_outside_a_room_imports_only_its_face() -> None:
    violations = _face_violations(_graph())
    assert not violations, "imports past a room's face:\n" + "\n".join(violations)


def test_the_check_finds_an_import_past_a_face() -> None:
    """The check itself can fail: a graph with an import past the read room's face and one past
    the jobs' reading room's face."""
    graph = copy.deepcopy(_graph())
    graph.add_import(
        importer="rlm.kafka.reads",
        imported="rlm.tiering.read.lookup",
        line_number=1,
        line_contents="from rlm.tiering.read.lookup import LATEST",
    )
    graph.add_import(
        importer="rlm.jobs.tables.sink",
        imported="rlm.jobs.reading.plan",
        line_number=2,
        line_contents="from rlm.jobs.reading.plan import ReadTask",
    )
    assert _face_violations(graph) == [
        "rlm.jobs.tables.sink:2: from rlm.jobs.reading.plan import ReadTask",
        "rlm.kafka.reads:1: from rlm.tiering.read.lookup import LATEST",
    ]

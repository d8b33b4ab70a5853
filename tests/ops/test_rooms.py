"""The tiering engine's rooms keep their faces (docs/architecture.md §1.1).

Code outside a room imports it through the room's package (``from rlm.tiering.read import
TieredReaders``, or a module object: ``from rlm.tiering.store import object_keys``), never ``from
rlm.tiering.read.readers import ...``: what a room exposes is what its ``__init__`` names, so its
modules can be split or merged without touching other packages. Tests may reach inside. The order
of the rooms is the import-linter contract "tiering rooms" in pyproject.toml.
"""

from __future__ import annotations

import copy
import re
from functools import cache

import grimp

ROOMS = ("store", "local", "converge", "copy", "expire", "read")


@cache
def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("rlm")


def _room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["rlm", "tiering"] and parts[2] in ROOMS else None


def _face_violations(graph: grimp.ImportGraph) -> list[str]:
    found = []
    for imported in sorted(m for m in graph.modules if _room_of(m)):
        room = _room_of(imported)
        face = re.compile(rf"^from rlm\.tiering\.{room} import ")
        for importer in sorted(graph.find_modules_that_directly_import(imported)):
            if _room_of(importer) == room or importer == f"rlm.tiering.{room}":
                continue
            for detail in graph.get_import_details(importer=importer, imported=imported):
                if not face.match(detail["line_contents"]):
                    found.append(f"{importer}:{detail['line_number']}: {detail['line_contents']}")
    return found


def test_every_room_has_a_face_naming_what_it_exports() -> None:
    import importlib

    for room in ROOMS:
        module = importlib.import_module(f"rlm.tiering.{room}")
        assert module.__doc__ and "public face" in module.__doc__, room
        exported = getattr(module, "__all__", None)
        assert exported, f"rlm.tiering.{room} names no public face (__all__)"
        assert all(hasattr(module, name) for name in exported), room


def test_code_outside_a_room_imports_only_its_face() -> None:
    violations = _face_violations(_graph())
    assert not violations, "imports past a room's face:\n" + "\n".join(violations)


def test_the_check_finds_an_import_past_a_face() -> None:
    """The check itself can fail: a graph with one import past the read room's face."""
    graph = copy.deepcopy(_graph())
    graph.add_import(
        importer="rlm.kafka.reads",
        imported="rlm.tiering.read.lookup",
        line_number=1,
        line_contents="from rlm.tiering.read.lookup import LATEST",
    )
    assert _face_violations(graph) == ["rlm.kafka.reads:1: from rlm.tiering.read.lookup import LATEST"]

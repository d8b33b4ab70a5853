"""One reader of the store's manifests and lineage markers (docs/remote-state.md, "One reader"):
every module reads them through :class:`~rlm.tiering.store.remote_state.RemoteState`, whose
``read_manifest`` calls the one parse-and-trust mechanism, ``StoreProtection.read_manifest`` /
``load_manifest`` (rlm/tiering/store/store_protection.py, docs/protection.md §9). A second reader could
trust what the daemon refuses, or refuse what it serves; ``rlm verify`` gets its "report, don't
raise" mode from the same reads, so it and the daemon cannot disagree on what a manifest says.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.tiering.helpers import REPO

STORE = REPO / "rlm" / "tiering" / "store"
REMOTE_STATE = STORE / "remote_state.py"
PROTECT = STORE / "store_protection.py"


def _called(node: ast.Call) -> tuple[str | None, str | None]:
    """(the called name, the name of the object it is an attribute of, when that is a name)."""
    f = node.func
    if isinstance(f, ast.Name):
        return f.id, None
    if isinstance(f, ast.Attribute):
        owner = f.value.id if isinstance(f.value, ast.Name) else None
        return f.attr, owner
    return None, None


def _reads_the_store(node: ast.expr) -> bool:
    """``node`` is a read of an object (``x.read(...)``, ``x.read_at_most(...)``)."""
    return isinstance(node, ast.Call) and _called(node)[0] in ("read", "read_at_most")


def store_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` of each read of a manifest or lineage marker that is not RemoteState's:

    - ``read_manifest(read, key)``: the mechanism, given a store read (RemoteState's own
      ``read_manifest(key)`` takes one positional argument);
    - ``load_manifest`` / ``check_manifest``: parse and trust stored bytes;
    - ``LineageMarker.from_json``: parse a lineage marker;
    - ``SegmentManifest.from_json(x.read(...))``: parse a manifest straight from the store, past
      the trust check.
    """
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name, owner = _called(node)
        if name == "read_manifest" and len(node.args) >= 2:
            found.append((node.lineno, "read_manifest(read, key)"))
        elif name in ("load_manifest", "check_manifest"):
            found.append((node.lineno, name))
        elif name == "from_json" and owner == "LineageMarker":
            found.append((node.lineno, "LineageMarker.from_json"))
        elif (
            name == "from_json"
            and owner == "SegmentManifest"
            and node.args
            and _reads_the_store(node.args[0])
        ):
            found.append((node.lineno, "SegmentManifest.from_json(<store read>)"))
    return found


#: Where each read may stand: RemoteState (the reader) and, for the mechanism it calls,
#: StoreProtection.read_manifest's own body.
ALLOWED = {
    REMOTE_STATE: {"read_manifest(read, key)", "LineageMarker.from_json"},
    PROTECT: {"load_manifest", "check_manifest"},
}


def test_only_remote_state_reads_manifests_and_lineage_markers() -> None:
    found = []
    for path in sorted((REPO / "rlm").rglob("*.py")):
        allowed = ALLOWED.get(path, set())
        for line, what in store_reads(ast.parse(path.read_text())):
            if what not in allowed:
                found.append(f"{path.relative_to(REPO)}:{line}: {what}")
    assert not found, "manifests or lineage markers read outside RemoteState:\n" + "\n".join(found)


#: RemoteState's reads of one manifest or marker, and what they raise for one a reader may not use.
_READS = {"read_manifest", "manifest_at", "read_lineage_marker"}
_UNUSABLE = {"FormatError", "ProtectionError", "TamperedObjectError", "KeyNotFoundError", "WrongKeyError"}


def _caught(handler: ast.ExceptHandler) -> set[str]:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return {k.id for k in kinds if isinstance(k, ast.Name)}


def own_reports(tree: ast.AST) -> list[int]:
    """Lines of ``try`` blocks that read a manifest or marker and catch what makes it unusable:
    a second "report, don't raise" mode, which could skip what the daemon refuses."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try) or not any(_caught(h) & _UNUSABLE for h in node.handlers):
            continue
        body = ast.Module(body=node.body, type_ignores=[])
        if any(isinstance(c, ast.Call) and _called(c)[0] in _READS for c in ast.walk(body)):
            found.append(node.lineno)
    return found


def test_only_remote_state_reports_unusable_manifests() -> None:
    """``rlm verify`` asks ``RemoteState.manifests_of(listing, report=True)`` (and
    ``lineages_of``) instead of catching the errors of each read itself."""
    found = []
    for path in sorted((REPO / "rlm").rglob("*.py")):
        if path != REMOTE_STATE:
            found += [f"{path.relative_to(REPO)}:{line}" for line in own_reports(ast.parse(path.read_text()))]
    assert not found, "unusable manifests or markers reported outside RemoteState:\n" + "\n".join(found)


def test_the_check_sees_each_way_around_the_reader() -> None:
    src = "\n".join(
        [
            "m = self.protection.read_manifest(self.backend.read, key)",  # 1: the mechanism
            "m = protection.load_manifest(data, key)",  # 2
            "check_manifest(ring, m, key, trust_unauthenticated=False)",  # 3
            "marker = LineageMarker.from_json(backend.read(key), key=key)",  # 4
            "m = SegmentManifest.from_json(backend.read_at_most(key, 1 << 20))",  # 5
            "m = remote.read_manifest(key)",  # RemoteState's: fine
            "m = SegmentManifest.from_json(shipped)",  # JSON a driver shipped, read by RemoteState
        ]
    )
    assert [line for line, _ in store_reads(ast.parse(src))] == [1, 2, 3, 4, 5]
    own = "\n".join(
        [
            "try:",  # 1
            "    m = remote.read_manifest(key)",
            "except (FormatError, ProtectionError) as err:",
            "    problems.append(err)",
            "try:",  # 5: what is not about trust is the caller's to handle
            "    m = remote.manifest_at(base)",
            "except ObjectNotFoundError:",
            "    m = None",
        ]
    )
    assert own_reports(ast.parse(own)) == [1]


def test_the_allowed_files_exist() -> None:
    """The allowance names real files: a move of the reader must move it too."""
    assert all(Path(p).is_file() for p in ALLOWED)
    assert store_reads(ast.parse(REMOTE_STATE.read_text())), "RemoteState reads through the mechanism"

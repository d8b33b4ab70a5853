"""A partition's committed manifests as this node last knew them, kept beside its progress so a
restart need not read them from the store again (docs/remote-state.md, "What a restart reads").

``<state dir>/manifests.snapshot``: one JSON header line, then the body — a JSON array of
``[key, stamp, manifest JSON]`` rows in offset order. The header holds the highest tiered offset
and remote log start the body was written for, the number and total bytes of the manifests, the
oldest one's ``(base, last, max timestamp, size)`` (what retention looks at first) and the CRC-32
of the body. A restart reads the header and checks the CRC; the body is parsed only when a pass
needs the manifests (a copy, retention that is due, status).

The snapshot is a cache: it is rewritten (atomically, without fsync — the CRC catches a torn or
empty file after a power loss) every time the progress is saved, *before* it, so a crash between
the two leaves a header that no longer matches ``progress.json``; any mismatch, a bad CRC or a
missing file sends the partition through the full recovery from the store.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rlm.errors import FormatError
from rlm.fsutil import atomic_write
from rlm.tiering.store import SegmentManifest, Stamp

__all__ = [
    "MANIFEST_SNAPSHOT_FILE",
    "UNKNOWN_STAMP",
    "VERSION",
    "ManifestSnapshotHeader",
    "Row",
    "load",
    "oldest_of",
    "read_header",
    "save",
    "stamps_of",
]

MANIFEST_SNAPSHOT_FILE = "manifests.snapshot"
VERSION = 1
#: The stamp of a manifest whose listing this node has not seen (it committed it itself): the next
#: listing, if any, reads it once to learn its stamp (rlm.tiering.converge.sync).
UNKNOWN_STAMP: Stamp = (-1, None, None)

Row = tuple[str, Stamp, SegmentManifest]


@dataclass(frozen=True, slots=True)
class ManifestSnapshotHeader:
    """What a snapshot holds, without its manifests (offsets inclusive, sizes in bytes)."""

    highest: int
    start: int
    count: int
    bytes: int
    #: The oldest manifest's (base offset, last offset, max timestamp in ms, size), None when empty.
    oldest: tuple[int, int, int, int] | None


def oldest_of(manifests: list[SegmentManifest]) -> tuple[int, int, int, int] | None:
    """``ManifestSnapshotHeader.oldest`` of a list in offset order."""
    if not manifests:
        return None
    m = manifests[0]
    return m.base_offset, m.last_offset, m.max_timestamp, m.size_bytes


def save(
    path: Path,
    manifests: list[SegmentManifest],
    stamps: Mapping[tuple[int, str], tuple[str, Stamp]],
    highest: int,
    start: int,
) -> None:
    """Write the snapshot of ``manifests`` (in offset order); ``stamps`` maps (base offset, attempt
    id) to the manifest's key and listing stamp where known."""
    rows = []
    for m in manifests:
        key, stamp = stamps.get((m.base_offset, m.attempt_id), ("", UNKNOWN_STAMP))
        rows.append([key, list(stamp), m.to_json().decode("utf-8")])
    body = json.dumps(rows, separators=(",", ":")).encode("utf-8")
    header = {
        "version": VERSION,
        "highest": highest,
        "start": start,
        "count": len(manifests),
        "bytes": sum(m.size_bytes for m in manifests),
        "oldest": oldest_of(manifests),
        "crc32": zlib.crc32(body),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(header).encode("utf-8") + b"\n" + body, durable=False)


def _split(path: Path) -> tuple[dict[str, object], bytes]:
    """The checked header and the body; FormatError naming the file when either is damaged."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise FormatError(f"cannot read the manifest snapshot: {err}", file=path) from err
    head, sep, body = data.partition(b"\n")
    try:
        header = json.loads(head)
    except (ValueError, RecursionError):
        header = None
    if not sep or not isinstance(header, dict) or header.get("version") != VERSION:
        raise FormatError("manifest snapshot: missing or unreadable header", file=path)
    if header.get("crc32") != zlib.crc32(body):
        raise FormatError("manifest snapshot: body CRC mismatch (torn write)", file=path)
    return header, body


def _int(header: dict[str, object], name: str, path: Path) -> int:
    value = header.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise FormatError(
            f"manifest snapshot: header field {name} = {value!r}: must be an integer", file=path
        )
    return value


def read_header(path: Path) -> ManifestSnapshotHeader | None:
    """The header of a whole, CRC-checked snapshot; None when it is missing or damaged."""
    try:
        header, _ = _split(path)
        oldest = header.get("oldest")
        parsed = None
        if oldest is not None:
            if (
                not isinstance(oldest, list)
                or len(oldest) != 4
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in oldest)
            ):
                return None
            parsed = (oldest[0], oldest[1], oldest[2], oldest[3])
        return ManifestSnapshotHeader(
            _int(header, "highest", path),
            _int(header, "start", path),
            _int(header, "count", path),
            _int(header, "bytes", path),
            parsed,
        )
    except FormatError:
        return None


def _stamp(value: object) -> Stamp:
    if (
        isinstance(value, list)
        and len(value) == 3
        and isinstance(value[0], int)
        and (value[1] is None or isinstance(value[1], str))
        and (value[2] is None or isinstance(value[2], (int, float)))
    ):
        return value[0], value[1], None if value[2] is None else float(value[2])
    raise ValueError(f"bad stamp {value!r}")


def load(path: Path) -> list[Row]:
    """Every row of the snapshot, in offset order; FormatError naming the file when damaged."""
    _, body = _split(path)
    try:
        rows = json.loads(body)
        out: list[Row] = []
        for key, stamp, doc in rows:
            if not isinstance(key, str) or not isinstance(doc, str):
                raise ValueError("a row is not [key, stamp, manifest]")
            manifest = SegmentManifest.from_json(doc.encode("utf-8"), key=key or str(path))
            out.append((key, _stamp(stamp), manifest))
        return out
    except FormatError as err:
        raise err.in_file(path) from err
    except (ValueError, TypeError, RecursionError) as err:
        raise FormatError(f"manifest snapshot: {err}", file=path) from err


def stamps_of(
    view_manifests: Iterable[tuple[str, tuple[Stamp, SegmentManifest]]],
) -> dict[tuple[int, str], tuple[str, Stamp]]:
    """(base offset, attempt id) → (key, stamp) of a store view's manifests."""
    return {(m.base_offset, m.attempt_id): (key, stamp) for key, (stamp, m) in view_manifests}

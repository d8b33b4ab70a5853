"""SegmentManifest.to_json writes exactly what the dataclasses.asdict encoding wrote (the shallow
encoding is the manifest snapshot's hot path: every manifest of a partition at each commit), and
reads back to the same manifest, for every optional part of a manifest."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from rlm.tiering.store.keyring import WrappedKey
from rlm.tiering.store.manifest import ManifestAuth, Protection, SegmentManifest, StoredObject


def _reference(m: SegmentManifest) -> bytes:
    """The encoding as it was before the shallow one (dataclasses.asdict), kept as the oracle."""
    doc = dataclasses.asdict(m)
    doc.pop("extra")
    doc["leader_epochs"] = [list(e) for e in m.leader_epochs]
    doc["protection"] = None if m.protection is None else m.protection.to_json()
    doc["auth"] = None if m.auth is None else m.auth.to_json()
    for name in ("source_base_offset", "source_position", "txn_index", "protection", "auth"):
        if doc[name] is None:
            del doc[name]
    doc.update(m.extra)
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")


BASE = SegmentManifest(
    "orders",
    3,
    1000,
    1999,
    1_700_000_000_000,
    1_700_000_009_999,
    8 << 20,
    120,
    40,
    "attempt-1",
    1_700_000_100_000,
    {
        name: StoredObject(f"orders-3/data/00000000000000001000-attempt-1/{name}", 100 + i, 7 * i)
        for i, name in enumerate(("log", "index", "timeindex", "entries"))
    },
)

VARIANTS: dict[str, dict[str, Any]] = {
    "whole segment": {},
    "leader epochs": {"leader_epochs": ((3, 0), (4, 1500))},
    "partial copy": {"source_base_offset": 900, "source_position": 4096},
    "transactions": {"txn_index": {"source": "broker", "entries": 2, "open_at_end": [[7, 1990]]}},
    "compressed": {"protection": Protection("zstd", 12345)},
    "encrypted and signed": {
        "protection": Protection("zstd", 54321, WrappedKey("k1", bytes(range(60)))),
        "auth": ManifestAuth("k1", bytes(32)),
    },
    "unknown fields kept": {"extra": {"future_field": {"a": [1, 2]}}},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_to_json_is_the_reference_encoding_and_reads_back(variant: str) -> None:
    manifest = dataclasses.replace(BASE, **VARIANTS[variant])
    assert manifest.to_json() == _reference(manifest)
    assert SegmentManifest.from_json(manifest.to_json(), key="k") == manifest

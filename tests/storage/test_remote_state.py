"""rlm.tiering.store.remote_state against real stores: the in-memory backend and moto's S3 server.

The store is filled by the real copy protocol (a generated log dir tiered by RemoteLogManager), then
stray attempts are added the way a crashed copier would leave them; the queries are checked
against what the manager itself recorded and against the raw listing.
"""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.config import load_settings
from rlm.errors import FormatError, ObjectNotFoundError, TamperedObjectError, TransientStorageError
from rlm.jobs.checks.verify_store import scrub_partition
from rlm.jobs.reading.plan import BackendSpec
from rlm.storage.api import ObjectInfo, StorageBackend
from rlm.storage.faults import FaultyBackend
from rlm.storage.memory import MemoryBackend
from rlm.storage.retry import RetryingBackend, RetryPolicy
from rlm.testing.configs import write_config
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.store import object_keys
from rlm.tiering.store.lineage import Chain
from rlm.tiering.store.manifest import ENTRIES_OBJECT
from rlm.tiering.store.remote_state import RemoteState, attempt_age_ms
from tests.storage.conftest import BUCKET

TOPIC = "rs"


@pytest.fixture(params=["memory", "s3"])
def store(request: pytest.FixtureRequest) -> Iterator[tuple[StorageBackend, BackendSpec]]:
    """A fresh, empty store and the plain-data spec an executor would build it from."""
    if request.param == "memory":
        spec = BackendSpec("memory", {"namespace": f"rs-{uuid.uuid4().hex}"})
    else:
        pytest.importorskip("rlm_storage_s3")
        endpoint = request.getfixturevalue("moto_endpoint")
        spec = BackendSpec(
            "s3",
            {
                "bucket": BUCKET,
                "prefix": f"rs-{uuid.uuid4().hex[:8]}",
                "endpoint_url": endpoint,
                "path_style": True,
            },
        )
    yield spec.create(), spec


@pytest.fixture
def tiered(
    tmp_path: Path, store: tuple[StorageBackend, BackendSpec]
) -> tuple[StorageBackend, BackendSpec, RemoteLogManager]:
    """``rs-0`` generated and tiered into ``store`` by the real daemon pass."""
    backend, spec = store
    logs = tmp_path / "logs"
    generate_log_dir(logs, [(TOPIC, 1)], seed=3, records=400, segment_bytes=8 * 1024)
    cfg = write_config(
        tmp_path / "c.toml", [logs], root=tmp_path / "unused", index_entry_bytes=2048, gc_grace_ms=60_000
    )
    manager = RemoteLogManager(load_settings(cfg), backend, metrics=TieringMetrics())
    result = manager.run_once()[0]
    assert result.error is None and len(result.copied) >= 3
    return backend, spec, manager


def _put_attempt(backend: StorageBackend, base: int, attempt: str) -> list[str]:
    """Objects of an attempt no manifest references (a copier that died before its manifest)."""
    put = [
        object_keys.data_key(TOPIC, 0, base, attempt, name)
        for name in (object_keys.LOG, object_keys.SEGMENT_ENTRIES)
    ]
    for n, key in enumerate(put):
        backend.put(key, b"x" * (10 + n))
    return put


def test_manifests_entries_and_the_chain(
    tiered: tuple[StorageBackend, BackendSpec, RemoteLogManager],
) -> None:
    backend, _, manager = tiered
    ctx = next(manager.contexts())
    remote = RemoteState(backend, TOPIC, 0)
    manifests = remote.list_manifests()
    assert [m.to_json() for m in manifests] == [m.to_json() for m in ctx.manifests]
    assert [m.base_offset for m in manifests] == sorted(m.base_offset for m in manifests)
    chain = remote.chain()  # one writer: every manifest is served whole
    assert chain.manifests == manifests and all(link.whole for link in chain.links)
    assert (chain.highest, chain.start) == (
        ctx.progress.highest_tiered_offset,
        ctx.progress.remote_log_start_offset,
    )
    assert (Chain(()).highest, Chain(()).start) == (-1, -1)
    for m in manifests:
        entries = remote.segment_entries(m)
        assert len(entries) == m.index_entries
        assert entries[0].first_offset >= m.base_offset and entries[-1].last_offset == m.last_offset
        assert remote.entries_blob(m) == b"".join(e.encode() for e in entries)
        assert remote.manifest_at(m.base_offset).to_json() == m.to_json()
    with pytest.raises(ObjectNotFoundError):
        remote.manifest_at(manifests[-1].last_offset + 1)


def test_corrupt_entries_object_names_its_key(
    tiered: tuple[StorageBackend, BackendSpec, RemoteLogManager],
) -> None:
    backend = tiered[0]
    remote = RemoteState(backend, TOPIC, 0)
    m = remote.list_manifests()[0]
    key = m.objects[ENTRIES_OBJECT].key
    blob = bytearray(backend.read(key))
    blob[-1] ^= 0xFF
    backend.put(key, bytes(blob))
    with pytest.raises(FormatError) as err:
        remote.segment_entries(m)
    assert key in str(err.value)


def test_verify_reports_what_the_daemon_refuses(
    tiered: tuple[StorageBackend, BackendSpec, RemoteLogManager],
) -> None:
    """One reading of manifests and lineage markers (docs/remote-state.md, "One reader"): the
    daemon's chain raises on one no reader may use; the report mode names each one instead, with
    the same error; and ``rlm verify``'s stage 1 reports exactly those keys."""
    backend, spec, _ = tiered
    remote = RemoteState(backend, TOPIC, 0)
    first, second, *rest = remote.list_manifests()
    garbled = object_keys.manifest_key(TOPIC, 0, first.base_offset)
    backend.put(garbled, b"{not a manifest")
    moved_to = rest[-1].last_offset + 1  # a genuine manifest copied to another key
    moved = object_keys.manifest_key(TOPIC, 0, moved_to)
    backend.put(moved, backend.read(object_keys.manifest_key(TOPIC, 0, second.base_offset)))
    marker = object_keys.lineage_marker_key(TOPIC, 0, 7)
    backend.put(marker, b"[]")
    listing = remote.list_manifests_prefix()

    with pytest.raises(FormatError, match=garbled):
        remote.chain()
    with pytest.raises(TamperedObjectError, match="moved or forged"):
        remote.manifests_of([i for i in listing if i.key != garbled])
    with pytest.raises(FormatError, match="malformed lineage marker"):
        remote.lineages_of(listing)

    manifests, unreadable = remote.manifests_of(listing, report=True)
    assert [m.base_offset for m in manifests] == [m.base_offset for m in [second, *rest]]
    assert [(u.kind, u.key, u.at) for u in unreadable] == [
        ("manifest", garbled, first.base_offset),
        ("manifest", moved, moved_to),
    ]
    assert isinstance(unreadable[0].error, FormatError) and isinstance(
        unreadable[1].error, TamperedObjectError
    )
    lineages, bad = remote.lineages_of(listing, report=True)
    assert lineages == [] and [(u.kind, u.key, u.at) for u in bad] == [("lineage_marker", marker, 7)]

    facts = scrub_partition(spec, TOPIC, 0, grace_ms=60_000, now_ms=int(time.time() * 1000))
    reported = {
        (p.check, p.key, p.base_offset if p.check != "lineage_marker" else p.offset, p.message)
        for p in facts.problems
        if p.check in ("manifest_unreadable", "manifest_key", "lineage_marker")
    }
    assert reported == {
        ("manifest_unreadable", garbled, first.base_offset, unreadable[0].error.reason),
        ("manifest_key", moved, moved_to, unreadable[1].error.reason),
        ("lineage_marker", marker, 7, bad[0].error.reason),
    }
    assert first.base_offset not in facts.orphan_bases  # a manifest names its attempt, unreadable or not


def test_orphans_by_age_grace_and_in_flight(
    tiered: tuple[StorageBackend, BackendSpec, RemoteLogManager],
) -> None:
    backend = tiered[0]
    remote = RemoteState(backend, TOPIC, 0)
    committed = remote.list_manifests()
    put_ms = int(time.time() * 1000)
    # Ages run from an attempt's last write: the newest of its id's time and its objects' stamps
    # (written now). "young" carries a later id, as a sidecar writing a minute later would.
    old_keys = _put_attempt(backend, committed[0].base_offset, object_keys.new_attempt_id(put_ms - 100_000))
    young = object_keys.new_attempt_id(put_ms + 60_000)
    _put_attempt(backend, 999_999, young)
    busy = object_keys.new_attempt_id(put_ms - 200_000)
    _put_attempt(backend, 999_998, busy)
    now = put_ms + 100_000
    assert remote.orphans(now, 0, ()) and len(remote.orphans(now, 0, ())) == 3  # committed ones never
    found = remote.orphans(now, 50_000, in_flight=[busy])
    assert [(o.base_offset, o.keys, o.bytes) for o in found] == [
        (committed[0].base_offset, tuple(sorted(old_keys)), 21)
    ]
    # S3 keeps LastModified in whole seconds: a stamp may read up to 1 s early.
    assert 100_000 - (int(time.time() * 1000) - put_ms) <= found[0].age_ms <= 101_000
    everything = remote.unreferenced(remote.attempts(remote.list_partition()), committed, now)
    assert {o.attempt_id: o.age_ms for o in everything}[young] == 40_000


def test_an_attempt_still_writing_is_young_whatever_its_id_says(
    tiered: tuple[StorageBackend, BackendSpec, RemoteLogManager],
) -> None:
    """Another sidecar's slow copy: its id is old, but it wrote an object just now, so the grace
    period runs from that write (docs/remote-state.md) and GC leaves it alone."""
    backend, _spec, manager = tiered
    slow = object_keys.new_attempt_id(int(time.time() * 1000) - 3_600_000)
    _put_attempt(backend, 7, slow)  # objects written now, id an hour old
    assert manager.collect_garbage(dry_run=True) == []  # gc_grace_ms is 60 s
    now = int(time.time() * 1000) + 61_000
    remote = RemoteState(backend, TOPIC, 0)
    assert [o.attempt_id for o in remote.orphans(now, 60_000)] == [slow]


def test_foreign_attempt_id_counts_as_new_in_gc_and_verify(
    tiered: tuple[StorageBackend, BackendSpec, RemoteLogManager],
) -> None:
    """The one rule (docs/remote-state.md): an id with no readable time is aged by its objects'
    store timestamps; GC keeps it and verify only warns while that is within the grace period."""
    backend, spec, manager = tiered
    before = time.time()
    put = _put_attempt(backend, 5, "manual-copy")
    now = int(time.time() * 1000) + 10_000
    remote = RemoteState(backend, TOPIC, 0)
    (orphan,) = remote.unreferenced(
        remote.attempts(backend.list(object_keys.data_prefix(TOPIC, 0))), remote.list_manifests(), now
    )
    # S3 keeps LastModified in whole seconds: the store's time may be up to 1 s before the put.
    assert 10_000 <= orphan.age_ms <= now - int(before * 1000) + 1_000
    assert manager.collect_garbage(dry_run=True) == []  # gc_grace_ms is 60 s: GC keeps it
    timed = object_keys.new_attempt_id(int(time.time() * 1000) - 100_000)
    _put_attempt(backend, 6, timed)
    assert manager.collect_garbage(dry_run=True) == []  # an old id, but its objects were just written
    facts = scrub_partition(spec, TOPIC, 0, grace_ms=60_000, now_ms=now)
    problem = next(p for p in facts.problems if p.check == "orphan" and p.base_offset == 5)
    assert problem.severity == "warning" and problem.base_offset == 5
    facts = scrub_partition(spec, TOPIC, 0, grace_ms=5_000, now_ms=now)
    assert [(p.base_offset, p.severity) for p in facts.problems if p.check == "orphan"] == [
        (5, "error"),
        (6, "error"),
    ]
    assert all(backend.exists(k) for k in put)


def test_attempt_age_rule() -> None:
    assert attempt_age_ms(object_keys.new_attempt_id(1_000), [], 5_000) == 4_000
    stamps = [ObjectInfo("a", 1, None, 2.0), ObjectInfo("b", 1, None, 3.5), ObjectInfo("c", 1)]
    assert attempt_age_ms("manual", stamps, 10_000) == 6_500  # the newest object counts
    assert attempt_age_ms(object_keys.new_attempt_id(1_000), stamps, 10_000) == 6_500  # a write after the id
    assert attempt_age_ms(object_keys.new_attempt_id(4_000), stamps, 10_000) == 6_000  # the id is newer
    assert attempt_age_ms("manual", [ObjectInfo("c", 1)], 10_000) == 0  # no time at all: new


def test_delete_attempt_and_manifest_are_idempotent(
    tiered: tuple[StorageBackend, BackendSpec, RemoteLogManager],
) -> None:
    backend = tiered[0]
    remote = RemoteState(backend, TOPIC, 0)
    put = _put_attempt(backend, 7, "stray")
    assert sorted(remote.delete_attempt(7, "stray")) == sorted(put)
    assert remote.delete_attempt(7, "stray") == []
    last = remote.list_manifests()[-1]
    remote.delete_manifest(last.base_offset)
    remote.delete_manifest(last.base_offset)
    assert [m.base_offset for m in remote.list_manifests()][-1] < last.base_offset


def test_picklable_for_executors(tiered: tuple[StorageBackend, BackendSpec, RemoteLogManager]) -> None:
    backend = tiered[0]
    remote = RemoteState(backend, TOPIC, 0)
    copy = pickle.loads(pickle.dumps(remote))
    assert [m.to_json() for m in copy.list_manifests()] == [m.to_json() for m in remote.list_manifests()]


def test_the_backends_retry_layer_is_the_only_one() -> None:
    """RemoteState adds no retries of its own: over a bare backend one transient error is one
    failure; over the retry layer (as every opened store has it) the listing is retried there."""
    inner = MemoryBackend()
    inner.put(object_keys.manifest_key(TOPIC, 0, 0), b"{}")
    opts: dict[str, Any] = {"error_rate": 1.0, "max_faults": 2, "operations": ["list"]}
    flaky = FaultyBackend.wrap(inner, sleep=lambda s: None, **opts)
    with pytest.raises(TransientStorageError):
        RemoteState(flaky, TOPIC, 0).list_prefix("")
    assert flaky.injected["error"] == 1
    flaky = FaultyBackend.wrap(inner, sleep=lambda s: None, **opts)
    retrying = RetryingBackend(flaky, RetryPolicy(max_attempts=3, sleep=lambda s: None))
    listed = RemoteState(retrying, TOPIC, 0).list_prefix("")
    assert [i.key for i in listed] == [object_keys.manifest_key(TOPIC, 0, 0)]


def test_other_id_roots_groups_every_other_incarnation_by_topic_id() -> None:
    backend = MemoryBackend(namespace=f"roots-{uuid.uuid4().hex}")
    ids = ["AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB", "CCCCCCCCCCCCCCCCCCCCCC"]
    put = {
        object_keys.manifest_key(TOPIC, 0, 0): b"{}",  # the name-only root: never an id root
        object_keys.manifest_key(TOPIC, 0, 0, ids[0]): b"{}",
        object_keys.data_key(TOPIC, 0, 0, "a", object_keys.LOG, ids[1]): b"x",
        object_keys.manifest_key(TOPIC, 0, 5, ids[1]): b"{}",
        object_keys.manifest_key(TOPIC, 0, 0, ids[2]): b"{}",
        object_keys.manifest_key(TOPIC, 1, 0, ids[1]): b"{}",  # another partition
        object_keys.manifest_key(TOPIC + "x", 0, 0, ids[1]): b"{}",  # another topic
    }
    for key, data in put.items():
        backend.put(key, data)
    remote = RemoteState(backend, TOPIC, 0, ids[0])
    found = remote.other_id_roots(ids[2])
    assert sorted(found) == ids[:2]
    assert sorted(i.key for i in found[ids[1]]) == sorted(
        [
            object_keys.data_key(TOPIC, 0, 0, "a", object_keys.LOG, ids[1]),
            object_keys.manifest_key(TOPIC, 0, 5, ids[1]),
        ]
    )
    assert sorted(remote.other_id_roots(None)) == ids

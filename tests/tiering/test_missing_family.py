"""A partition whose local remote-index family is missing or half rebuilt (issue #29 item 3 a, b;
docs/read-path.md "When the local remote index is missing").

Readers answer the remote tier from the store's manifests while the family does not cover what the
progress says was tiered: never "out of range" for an offset the store holds, never a shortened
answer. A rebuild publishes whole sets (the ``.remoteoffsetindex`` renamed into place last), so a
reader never sees one half written.

Real parts: a transactional partition written with LogWriter, tiered by a real manager into the
local store, its tiered local segments deleted as the broker's retention does; the CLI as a
subprocess, the daemon's own wiring (``build_api``, the HTTP server and the Kafka listener) in
process with a real kafka-python consumer, and ``rlm run`` killed at a crash point mid-rebuild.
"""

from __future__ import annotations

import base64
import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from rlm.cli.wiring import build_api
from rlm.config import Settings, load_settings
from rlm.formats import naming
from rlm.http.client import RlmClient
from rlm.http.server import ApiServer
from rlm.kafka.api import KafkaApi
from rlm.kafka.server import KafkaListener
from rlm.logdir.discovery import partition_dir
from rlm.logdir.index_sets import SetCache
from rlm.storage.local import LocalBackend
from rlm.testing.configs import faulty_local_options, write_config
from rlm.testing.daemon import rlm_cli
from rlm.tiering.local.index_family import RemoteIndexFamily, RemoteIndexSet
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.local.remote_root import remote_view
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.store.remote_state import RemoteState
from tests.lookup.helpers import delete_local_segments
from tests.tiering.txn_helpers import Oracle, read_committed_in_process, write_txn_log

TOPIC = "txn"
Row = tuple[int, bytes | None, bytes | None]


@dataclass
class Env:
    logs: Path
    part: Path
    store: Path
    config: Path
    oracle: Oracle
    deleted: list[int]

    @property
    def settings(self) -> Settings:
        return load_settings(self.config)

    def manager(self) -> RemoteLogManager:
        return RemoteLogManager(self.settings, LocalBackend(root=str(self.store)), metrics=TieringMetrics())

    def family_files(self) -> list[Path]:
        return sorted(self.part.glob("*.remote*"))

    def remove_family(self) -> None:
        for path in self.family_files():
            path.unlink()

    def half_rebuild(self, links: int) -> int:
        """Leave the family as a rebuild interrupted after ``links`` links leaves it when it appends
        in place: the store chain's first links only, while progress.json says all was tiered.
        Returns the chain's length."""
        settings = self.settings
        part = partition_dir(self.logs, TOPIC, 0, self.part)
        remote = RemoteState(
            LocalBackend(root=str(self.store)), TOPIC, 0, remote_view(settings.tiering, part).key_id
        )
        chain = remote.chain()
        self.remove_family()
        family = RemoteIndexFamily(
            self.part, self.logs.parent / "state-meta.json", rotate_bytes=1 << 30, rotate_ms=1 << 40
        )
        family.open()
        for link in chain.links[:links]:
            family.append_segment(remote.link_entries(link))
        return len(chain.links)


def make_env(tmp_path: Path, **tiering: Any) -> Env:
    logs, store = tmp_path / "logs", tmp_path / "store"
    write_txn_log(logs, TOPIC, 0, seed=5, leave_open=True)
    part = logs / f"{TOPIC}-0"
    oracle = Oracle.of(part)
    config = write_config(
        tmp_path / "rlm.toml", [logs], root=store, index_entry_bytes=2_000, eligibility="rolled", **tiering
    )
    env = Env(logs, part, store, config, oracle, [])
    assert all(r.error is None for r in env.manager().run_once(gc=False))
    env.deleted = delete_local_segments(part, keep_last=3)
    assert len(env.deleted) > 5 and env.family_files()
    return env


def committed(o: Oracle) -> list[Row]:
    return [(r.offset, r.key, r.value) for r in o.committed]


def _b64(v: str | None) -> bytes | None:
    return None if v is None else base64.b64decode(v)


def http_read_committed(client: RlmClient, start: int = 0) -> tuple[list[Row], int]:
    """``/records`` read_committed (json) from ``start`` until it advances no further."""
    offset, out = start, []
    while True:
        doc = client.fetch_json(TOPIC, 0, offset, 3_000, isolation="read_committed")
        out += [
            (r["offset"], _b64(r["key"]), _b64(r["value"]))
            for b in doc["batches"]
            for r in b["records"]
            if r["offset"] >= offset
        ]
        if doc["next_offset"] == offset:
            return out, offset
        offset = doc["next_offset"]


def kafka_read_committed(bootstrap: str, count: int) -> list[Row]:
    """A real kafka-python consumer, read_committed from the log start: its own filter drops what
    the listener's aborted-transaction lists name."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        max_partition_fetch_bytes=4096,
        consumer_timeout_ms=10_000,
    )
    tp = TopicPartition(TOPIC, 0)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        out: list[Row] = []
        for msg in consumer:
            out.append((msg.offset, msg.key, msg.value))
            if len(out) >= count:
                break
        return out
    finally:
        consumer.close()


@contextmanager
def daemon_surface(env: Env) -> Iterator[tuple[RemoteLogManager, RlmClient, str]]:
    """The daemon's read surface as ``rlm run`` wires it (``build_api``: HTTP app and the readers the
    Kafka listener shares), before its first pass has run: what a reader reaches right after
    ``rlm run`` started. Yields the manager (to run the pass), an HTTP client and the bootstrap."""
    settings = load_settings(env.config)
    manager = env.manager()
    parts = build_api(settings, manager)
    server = ApiServer(parts.app, "127.0.0.1", 0).start()
    listener = KafkaListener(KafkaApi(parts.readers), replace(settings.kafka, listen="127.0.0.1:0")).start()
    try:
        with RlmClient(server.url) as client:
            yield manager, client, f"127.0.0.1:{listener.port}"
    finally:
        listener.stop()
        server.stop()


def lookup_cli(env: Env, offset: int) -> dict[str, Any]:
    done = rlm_cli("lookup", "--config", env.config, "--topic", TOPIC, "--partition", 0, "--offset", offset)
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


# -- (a) a missing family: lookups answer from the store -------------------------------------------


def test_lookup_of_a_tiered_offset_is_answered_while_the_family_is_missing(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    offset = env.deleted[2] + 1  # in a segment only the store holds now
    before = lookup_cli(env, offset)
    assert before["found"] and before["tier"] == "remote", before
    env.remove_family()
    after = lookup_cli(env, offset)
    assert after == before  # not "out of range" while valid_ranges says remote [0, highest]


def test_reads_during_a_half_rebuilt_family_are_whole(tmp_path: Path) -> None:
    """Issue #29 3(b): the family holds the chain's first links only (a rebuild that appends in
    place, interrupted or still running). read_committed over HTTP and over the Kafka listener
    must still return exactly the committed records from offset 0: the transactions' sources
    come from the same (whole) view as the records."""
    env = make_env(tmp_path)
    want = committed(env.oracle)
    links = env.half_rebuild(2)
    assert links > 4
    with daemon_surface(env) as (manager, client, bootstrap):
        got, stop = http_read_committed(client)
        assert got == want and stop == env.oracle.last_stable_offset
        assert kafka_read_committed(bootstrap, len(want)) == want
        hit = client.lookup_offset(TOPIC, 0, env.deleted[-1])
        assert hit["found"] and hit["tier"] == "remote", hit
        # the daemon's first pass completes the family; answers stay the same
        assert all(r.error is None for r in manager.run_once(gc=False))
        assert http_read_committed(client) == (got, stop)


# -- the writer: a rebuild publishes whole sets ---------------------------------------------------


def test_a_rebuild_killed_midway_left_nothing_half_published(tmp_path: Path) -> None:
    """``rlm run`` killed after two links of its rebuild (crash point ``mid_index_rebuild``): the
    rebuild is staged, so readers find no set at all (not the first two links) and answer from
    the store; the next run publishes the family byte for byte as it was before it was lost."""
    env = make_env(tmp_path)
    before = {p.name: p.read_bytes() for p in env.family_files()}
    env.remove_family()
    killed = rlm_cli("run", "--config", env.config, "--once", env={"RLM_CRASH_AT": "mid_index_rebuild:2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert SetCache().sets(env.part) == []  # entries written, no gate published
    assert read_committed_in_process(env.settings, env.store) == (
        committed(env.oracle),
        env.oracle.last_stable_offset,
    )
    done = rlm_cli("run", "--config", env.config, "--once")
    assert done.returncode == 0, done.stderr
    assert {p.name: p.read_bytes() for p in env.family_files()} == before


def test_staged_changes_stay_invisible_until_published(tmp_path: Path) -> None:
    """Inside ``RemoteIndexFamily.staged`` readers see the sets as they were; a set cut back is
    hidden (never shown torn); at the end every changed set appears whole."""
    env = make_env(tmp_path)
    links = env.half_rebuild(3)
    family = RemoteIndexFamily(env.part, tmp_path / "meta.json", rotate_bytes=1 << 30, rotate_ms=1 << 40)
    family.open()
    old = SetCache().sets(env.part)
    old_last = family.last_offset
    remote = RemoteState(LocalBackend(root=str(env.store)), TOPIC, 0, _key_id(env))
    chain = remote.chain().links
    with family.staged():
        family.append_segment(remote.link_entries(chain[3]))
        assert [v.last for v in SetCache().sets(env.part)] == [v.last for v in old]
        family.truncate_after(chain[1].last_offset)  # a rewind inside the block
        assert SetCache().sets(env.part) == []  # hidden, not cut short under a reader
        for link in chain[2:]:
            family.append_segment(remote.link_entries(link))
    new = SetCache().sets(env.part)
    assert len(new) == 1 and new[0].last is not None and old_last < new[0].last.entry.last_offset
    assert new[0].last.entry.last_offset == chain[-1].last_offset and links == len(chain)


def test_a_set_removed_from_the_middle_is_answered_from_the_store(tmp_path: Path) -> None:
    """Small sets (one per segment): removing one in the middle by hand must not make reads skip
    its offsets (the chain would jump to the next set); the store answers them."""
    env = make_env(tmp_path, index_rotate_bytes=1)
    bases = sorted(p.name for p in env.part.glob("*.remotelogindex"))
    assert len(bases) > 5
    middle = naming.parse_base_offset(bases[len(bases) // 2])
    offset = middle + 1
    before = lookup_cli(env, offset)
    for path in env.part.glob(f"{middle:020d}.remote*"):
        path.unlink()
    assert lookup_cli(env, offset) == before
    assert read_committed_in_process(env.settings, env.store) == (
        committed(env.oracle),
        env.oracle.last_stable_offset,
    )


def test_store_down_and_family_missing_is_an_error_saying_so(tmp_path: Path) -> None:
    """Neither the local index nor the store can answer: one error line naming the missing local
    index and the store's failure (exit 1, as any store failure), not "out of range"."""
    env = make_env(tmp_path)
    env.remove_family()
    env.config = write_config(
        tmp_path / "down.toml",
        [env.logs],
        backend="faulty",
        options=faulty_local_options(env.store, {"error_rate": 1.0, "operations": ["list", "read"]}),
        index_entry_bytes=2_000,
        eligibility="rolled",
    )
    done = rlm_cli("lookup", "--config", env.config, "--topic", TOPIC, "--partition", 0, "--offset", 5)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "local remote index has no set" in done.stderr and "rlm rebuild-index" in done.stderr
    assert "injected" in done.stderr and "out of range" not in done.stdout + done.stderr


def _key_id(env: Env) -> str | None:
    part = partition_dir(env.logs, TOPIC, 0, env.part)
    return remote_view(env.settings.tiering, part).key_id


def test_a_set_without_its_files_reads_as_empty_to_other_threads(tmp_path: Path) -> None:
    """The status page and lookups ask the family from other threads while a pass writes: a set
    just rotated in (no file until its first entries land) or one whose gate a staged change removed
    reads as empty, never raises (CI saw ``GET /v1/partitions`` fail with FileNotFoundError)."""
    env = make_env(tmp_path)
    env.half_rebuild(2)
    family = RemoteIndexFamily(env.part, tmp_path / "meta.json", rotate_bytes=1 << 30, rotate_ms=1 << 40)
    family.open()
    before = family.last_offset
    fresh = family._new_set(before + 1)  # what append_segment does before it writes the entries
    assert not fresh.log_index_path.exists()
    assert fresh.first_entry is None and fresh.last_entry is None
    assert family.last_offset == before
    hidden = RemoteIndexSet(env.part, family.sets[0].base_offset, 0)  # as a reader builds it
    hidden.hide()
    assert hidden.first_entry is None and hidden.last_entry is None

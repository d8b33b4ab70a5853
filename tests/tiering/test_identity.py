"""Topic identity (docs/topic-identity.md): a topic deleted and re-created under the same name is a
new incarnation — tiered, served and retained as its own, the old data never served — on real
LogWriter partitions, the real local backend and a fake clock."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlm.config import Settings, load_settings
from rlm.formats import naming
from rlm.formats.partition_metadata import format_partition_metadata
from rlm.formats.records import RecordSpec, decode_records
from rlm.jobs.reading.plan import plan_read
from rlm.logdir.discovery import REPLICATION_OFFSET_CHECKPOINT, list_segments
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.storage.spread import LAYOUT_KEY, open_spread
from rlm.testing.configs import write_config
from rlm.testing.counting import CountingBackend
from rlm.testing.daemon import rlm_cli
from rlm.tiering.converge.incarnations import IDENTITY_FILE, OldIncarnation
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.readers import TieredReaders
from rlm.tiering.store import object_keys

TOPIC = "re-made.t"
NAME = f"{TOPIC}-0"
ID_A = base64.urlsafe_b64encode(bytes(range(1, 17))).decode().rstrip("=")
ID_B = base64.urlsafe_b64encode(bytes(range(101, 117))).decode().rstrip("=")
TS = {"A": 1_600_000_000_000, "B": 1_700_000_000_000}
GRACE_MS = 60_000


class Env:
    """One log dir, one store, a fake clock; managers are built fresh (a restart) or reused."""

    def __init__(self, tmp_path: Path, spread: int = 0, **tiering: Any) -> None:
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        tiering.setdefault("old_incarnation_grace_ms", GRACE_MS)
        self.cfg = write_config(
            tmp_path / "c.toml", [self.logs], root=tmp_path / "store", prefix_spread=spread, **tiering
        )
        self.settings: Settings = load_settings(self.cfg)
        # [remote] prefix_spread (docs/key-spread.md): the store as every rlm process opens it.
        self.raw = LocalBackend(root=str(tmp_path / "store"))
        self.backend = open_spread(self.raw, spread)
        self.now = 10_000_000
        self.state_root = self.logs.parent / "logs.rlm-state"

    def manager(self) -> RemoteLogManager:
        return RemoteLogManager(
            self.settings, self.backend, metrics=TieringMetrics(), clock_ms=lambda: self.now
        )

    def write(self, topic_id: str | None, tag: str, records: int, *, hw_segment: int | None = None) -> int:
        """Create the partition (as a broker does on topic creation); return its log end offset.
        ``hw_segment``: the high watermark is that segment's base (fewer segments eligible)."""
        with LogWriter(self.logs, TOPIC, 0, segment_bytes=1024, topic_id=topic_id) as w:
            for i in range(records):
                w.append([RecordSpec(TS[tag] + i, f"k{i}".encode(), f"{tag}-{i:05d}".encode() * 3)])
            if hw_segment is not None:
                w.high_watermark = w.segment_base_offsets[hw_segment]
            return w.log_end_offset

    def delete_partition(self) -> None:
        shutil.rmtree(self.logs / NAME)  # Kafka renames it to *-delete, then removes it

    def readers(self, manager: RemoteLogManager | None = None) -> TieredReaders:
        """Readers as `rlm lookup` builds them, or with a live manager's progress (the daemon's API)."""
        return TieredReaders(
            self.settings, self.backend, progress=manager.live_progress if manager is not None else None
        )

    def keys_under(self, root: str) -> list[str]:
        return [i.key for i in self.backend.list(root)]

    def manifests(self, topic_id: str | None) -> list[str]:
        return [
            k
            for k in self.keys_under(object_keys.manifests_prefix(TOPIC, 0, topic_id))
            if k.endswith(".json")
        ]

    def drop_tiered_local_segments(self, highest: int) -> None:
        """Local retention: delete the rolled segments wholly tiered (so reads must go remote)."""
        segments = list_segments(self.logs / NAME)
        for seg, nxt in itertools.pairwise(segments):
            if nxt.base_offset - 1 <= highest:
                for suffix in (naming.LOG, naming.INDEX, naming.TIME_INDEX):
                    (self.logs / NAME / naming.segment_file_name(seg.base_offset, suffix)).unlink()


def _row(manager: RemoteLogManager) -> dict[str, Any]:
    [row] = manager.status()
    return row


def _old(manager: RemoteLogManager, *, dry_run: bool = False) -> list[OldIncarnation]:
    found: list[OldIncarnation] = []
    manager.collect_garbage(dry_run=dry_run, old=found)
    return found


def _values(data: bytes, batches: list[Any]) -> list[bytes]:
    return [r.value or b"" for b in batches for r in decode_records(data, b)]


def test_keys_roots_never_collide_and_parse_back() -> None:
    legacy, own = object_keys.root("a-1", 2), object_keys.root("a-1", 2, ID_A)
    assert legacy == "a-1-2/" and own == f"a-1-2={ID_A}/"
    assert not own.startswith(legacy) and not legacy.startswith(own)
    assert object_keys.parse_root(object_keys.manifest_key("a-1", 2, 7, ID_A)) == object_keys.Root(
        "a-1", 2, ID_A
    )
    assert object_keys.parse_root(
        object_keys.data_key("a-1", 2, 7, "x", object_keys.LOG)
    ) == object_keys.Root("a-1", 2, None)
    assert object_keys.parse_root(f"a-1-2=short/{object_keys.MANIFESTS}/x") is None
    assert object_keys.parse_manifest_key("a-1", 2, object_keys.manifest_key("a-1", 2, 7, ID_A)) is None
    assert object_keys.parse_manifest_key("a-1", 2, object_keys.manifest_key("a-1", 2, 7, ID_A), ID_A) == 7


def _assert_served_as_its_own_on_both_tiers(
    env: Env, manager: RemoteLogManager, highest_a: int, highest_b: int, leo_b: int
) -> None:
    """The re-created topic B is served from both tiers, the old incarnation's data never."""
    # Served as its own on both tiers, the old data never: drop B's tiered segments locally first.
    env.drop_tiered_local_segments(highest_b)
    for reader in (env.readers().reader(TOPIC, 0), env.readers(manager).reader(TOPIC, 0)):
        assert reader.progress.highest_tiered_offset == highest_b
        assert not reader.lookup_offset(highest_a).found
    reader = env.readers().reader(TOPIC, 0)
    first_b = reader.lookup_offset(0)
    assert first_b.found and first_b.tier == "remote" and first_b.timestamp == TS["B"]
    fetched = reader.fetch(0, 1 << 20)
    assert fetched.tier == "remote" and _values(fetched.data, fetched.batches)[0] == b"B-00000" * 3
    assert all(v.startswith(b"B-") for v in _values(fetched.data, fetched.batches))
    assert reader.lookup_timestamp(-5).offset == highest_b
    assert reader.lookup_timestamp(-2).timestamp == TS["B"]
    for offset in (leo_b, highest_a):
        assert not reader.lookup_offset(offset).found
    assert reader.lookup_timestamp(TS["A"]).timestamp == TS["B"]  # the first record at or after it
    remote_tasks = [t for t in plan_read(env.settings, [TOPIC]).tasks if t.source == "remote"]
    assert remote_tasks and all(t.location.startswith(object_keys.root(TOPIC, 0, ID_B)) for t in remote_tasks)


@pytest.mark.parametrize("spread", [0, 2], ids=["unspread", "spread2"])
@pytest.mark.parametrize("restart", [True, False], ids=["restarted", "running"])
def test_recreated_topic_is_its_own_and_the_old_one_is_retired(
    tmp_path: Path, restart: bool, spread: int
) -> None:
    env = Env(tmp_path, spread)
    first = env.manager()
    env.write(ID_A, "A", 400)
    first.run_once()
    highest_a = _row(first)["highest_tiered_offset"]
    old_manifests = env.manifests(ID_A)
    assert highest_a > 200 and old_manifests

    env.delete_partition()
    leo_b = env.write(ID_B, "B", 150)
    assert leo_b <= highest_a
    manager = env.manager() if restart else first
    results = manager.run_once()
    assert [r.error for r in results] == [None]

    row = _row(manager)
    assert row["topic_id"] == ID_B and row["identity_conflict"] is None and row["last_error"] is None
    highest_b = row["highest_tiered_offset"]
    assert 0 <= highest_b < leo_b
    assert row["remote_segments"] == len(env.manifests(ID_B)) > 0
    assert row["remote_log_start_offset"] == 0 and row["log_end_offset"] == leo_b
    assert env.manifests(ID_A) == old_manifests  # untouched: not retained or copied against
    [old] = row["old_incarnations"]
    assert old["topic_id"] == ID_A and old["prefix"] == object_keys.root(TOPIC, 0, ID_A)
    # Both incarnations' roots lie under the one hash prefix of the partition's name.
    heads = {i.key.split("/")[0] for i in env.raw.list("") if i.key != LAYOUT_KEY}
    want = (
        {hashlib.sha256(NAME.encode()).hexdigest()[:spread]}
        if spread
        else {object_keys.root(TOPIC, 0, ID_A)[:-1], object_keys.root(TOPIC, 0, ID_B)[:-1]}
    )
    assert heads == want
    assert old["objects"] > len(old_manifests) and old["bytes"] > 0 and not old["kept"]
    assert old["retired_ms"] == env.now and old["delete_after_ms"] == env.now + GRACE_MS

    _assert_served_as_its_own_on_both_tiers(env, manager, highest_a, highest_b, leo_b)

    # gc --dry-run lists it, deletes nothing; past the grace period GC deletes data and state.
    assert [o.topic_id for o in _old(manager, dry_run=True)] == [ID_A]
    assert env.manifests(ID_A) == old_manifests
    assert (env.state_root / f"{NAME}={ID_A}").is_dir()
    env.now += GRACE_MS - 1
    assert not any(o.deleted for o in _old(manager))
    env.now += 1
    [gone] = _old(manager)
    assert gone.deleted and env.keys_under(object_keys.root(TOPIC, 0, ID_A)) == []
    assert not (env.state_root / f"{NAME}={ID_A}").exists()
    assert _row(manager)["old_incarnations"] == []
    assert env.manifests(ID_B)  # the live incarnation is untouched


def test_kept_old_incarnation_stays_visible(tmp_path: Path) -> None:
    env = Env(tmp_path, keep_old_incarnations=True)
    env.write(ID_A, "A", 300)
    env.manager().run_once()
    old_manifests = env.manifests(ID_A)
    env.delete_partition()
    env.write(ID_B, "B", 100)
    manager = env.manager()
    manager.run_once()
    env.now += 10 * GRACE_MS
    manager.run_once()
    [old] = _row(env.manager())["old_incarnations"]
    assert old["kept"] and old["delete_after_ms"] is None and old["topic_id"] == ID_A
    assert env.manifests(ID_A) == old_manifests
    assert [o.deleted for o in _old(manager, dry_run=True)] == [False]


def _set_high_watermark(env: Env, hw: int) -> None:
    (env.logs / REPLICATION_OFFSET_CHECKPOINT).write_text(f"0\n1\n{TOPIC} 0 {hw}\n")


def test_name_only_partition_gaining_an_id_adopts_its_data(tmp_path: Path) -> None:
    env = Env(tmp_path)
    leo = env.write(None, "A", 400, hw_segment=3)
    env.manager().run_once()
    before = env.manifests(None)
    highest_before = _row(env.manager())["highest_tiered_offset"]
    assert before and (env.state_root / NAME / "progress.json").exists()

    # The broker is upgraded: it writes partition.metadata into the existing directory.
    (env.logs / NAME / "partition.metadata").write_bytes(format_partition_metadata(ID_A))
    _set_high_watermark(env, leo)
    manager = env.manager()
    assert [r.error for r in manager.run_once()] == [None]

    owner = json.loads(env.backend.read(object_keys.marker_key(TOPIC, 0, object_keys.OWNER_MARKER)))
    assert owner["topic_id"] == ID_A
    after = env.manifests(None)
    assert set(before) < set(after) and env.manifests(ID_A) == []  # one root, continued
    assert not (env.state_root / NAME).exists()
    assert json.loads((env.state_root / f"{NAME}={ID_A}" / "progress.json").read_text())[
        "remote_root"
    ] == object_keys.root(TOPIC, 0)
    row = _row(env.manager())
    assert row["topic_id"] == ID_A and row["old_incarnations"] == [] and row["identity_conflict"] is None
    assert row["highest_tiered_offset"] > highest_before and row["remote_segments"] == len(after)
    env.drop_tiered_local_segments(row["highest_tiered_offset"])
    found = env.readers().reader(TOPIC, 0).lookup_offset(0)
    assert found.found and found.tier == "remote" and found.timestamp == TS["A"]


def test_new_id_does_not_adopt_a_different_log_under_the_name(tmp_path: Path) -> None:
    env = Env(tmp_path)
    env.write(None, "A", 200)
    env.manager().run_once()
    legacy = env.manifests(None)
    highest_a = _row(env.manager())["highest_tiered_offset"]
    env.delete_partition()
    assert env.write(ID_B, "B", 400) > highest_a + 1  # longer: only the batch comparison can tell
    manager = env.manager()
    assert [r.error for r in manager.run_once()] == [None]

    retired = json.loads(env.backend.read(object_keys.marker_key(TOPIC, 0, object_keys.RETIRED_MARKER)))
    assert retired["retired_by"] == ID_B and "differs" in retired["reason"]
    assert not env.backend.exists(object_keys.marker_key(TOPIC, 0, object_keys.OWNER_MARKER))
    assert env.manifests(None) == legacy and env.manifests(ID_B)
    row = _row(env.manager())
    assert [o["topic_id"] for o in row["old_incarnations"]] == [None]
    assert row["old_incarnations"][0]["prefix"] == object_keys.root(TOPIC, 0)
    env.drop_tiered_local_segments(row["highest_tiered_offset"])
    found = env.readers().reader(TOPIC, 0).lookup_offset(0)
    assert found.found and found.tier == "remote" and found.timestamp == TS["B"]
    env.now += GRACE_MS
    _old(manager)
    assert env.manifests(None) == [] and env.keys_under(object_keys.root(TOPIC, 0)) == []
    assert not (env.state_root / NAME).exists() and env.manifests(ID_B)


def test_an_id_that_already_tiered_under_its_own_root_never_adopts_the_name_later(tmp_path: Path) -> None:
    """Name-only data appearing after this incarnation tiered under its own root (another replica
    on a broker without partition.metadata, mid rolling upgrade) is retired, not adopted: adopting
    would split one log over two roots and make its own root look old to GC."""
    env = Env(tmp_path)
    env.write(ID_A, "A", 200)
    assert [r.error for r in env.manager().run_once()] == [None]
    own = env.manifests(ID_A)
    assert own and env.manifests(None) == []
    for key in env.keys_under(object_keys.root(TOPIC, 0, ID_A)):  # the same log, now under the name too
        env.backend.put(
            key.replace(object_keys.root(TOPIC, 0, ID_A), object_keys.root(TOPIC, 0), 1),
            env.backend.read(key),
        )
    manager = env.manager()  # a restart, then GC notices the name-only root is no longer empty
    assert [r.error for r in manager.run_once()] == [None]
    assert [r.error for r in manager.run_once()] == [None]  # so this pass recovers and decides it
    retired = json.loads(env.backend.read(object_keys.marker_key(TOPIC, 0, object_keys.RETIRED_MARKER)))
    assert retired["retired_by"] == ID_A and "own root" in retired["reason"]
    assert not env.backend.exists(object_keys.marker_key(TOPIC, 0, object_keys.OWNER_MARKER))
    assert [o["topic_id"] for o in _row(manager)["old_incarnations"]] == [None]
    env.now += GRACE_MS
    _old(manager)
    assert env.manifests(ID_A) == own and env.manifests(None) == []


@pytest.mark.parametrize("records", [60, 500], ids=["ends-below", "records-differ"])
@pytest.mark.parametrize("restart", [True, False], ids=["restarted", "running"])
def test_without_topic_id_a_recreated_log_is_a_conflict_never_served(
    tmp_path: Path, records: int, restart: bool
) -> None:
    env = Env(tmp_path)
    env.write(None, "A", 250)
    first = env.manager()
    first.run_once()
    legacy = env.manifests(None)
    highest_a = _row(first)["highest_tiered_offset"]
    env.delete_partition()
    leo_b = env.write(None, "B", records)
    assert (leo_b <= highest_a) == (records == 60)

    manager = env.manager() if restart else first
    errors = [r.error for _ in range(2) for r in manager.run_once()]  # a running daemon needs 2
    assert errors[-1] is not None and "re-created" in errors[-1]
    row = _row(manager)
    assert row["identity_conflict"] is not None and "re-created" in row["identity_conflict"]
    assert row["last_error"] is not None and "re-created" in row["last_error"]
    assert row["highest_tiered_offset"] == -1 and row["remote_segments"] == 0
    assert row["remote_log_start_offset"] is None
    assert env.manifests(None) == legacy  # nothing copied over or beside the old data
    assert _row(env.manager())["identity_conflict"] == row["identity_conflict"]  # `rlm status`

    live = env.readers(manager).reader(TOPIC, 0)
    assert live.progress.highest_tiered_offset == -1 and not live.lookup_offset(0, tier="remote").found
    reader = env.readers().reader(TOPIC, 0)
    assert not reader.lookup_offset(0, tier="remote").found
    assert not reader.lookup_timestamp(-5).found
    local = reader.lookup_offset(0)
    assert local.tier == "local" and local.timestamp == TS["B"]
    assert reader.lookup_timestamp(-2).timestamp == TS["B"]
    if leo_b <= highest_a:
        assert not reader.lookup_offset(leo_b).found and not reader.lookup_offset(highest_a).found
    plan = plan_read(env.settings, [TOPIC])
    assert [t for t in plan.tasks if t.source == "remote"] == []
    assert plan.partitions[0].highest_tiered_offset == -1


def _json_lines(text: str) -> list[Any]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_run_once_subprocess_across_recreation(tmp_path: Path) -> None:
    """`python -m rlm run --once` before and after the topic is deleted and re-created."""
    env = Env(tmp_path)
    env.write(ID_A, "A", 400)
    proc = rlm_cli("run", "--config", env.cfg, "--once", "--quiet")
    assert proc.returncode == 0, proc.stderr
    [status] = _json_lines(rlm_cli("status", "--config", env.cfg).stdout)
    highest_a = status[0]["highest_tiered_offset"]

    env.delete_partition()
    leo_b = env.write(ID_B, "B", 150)
    proc = rlm_cli("run", "--config", env.cfg, "--once", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert _json_lines(proc.stdout)[-1]["errors"] == {}
    [status] = _json_lines(rlm_cli("status", "--config", env.cfg).stdout)
    [row] = status
    assert row["topic_id"] == ID_B and 0 <= row["highest_tiered_offset"] < leo_b <= highest_a
    assert [o["topic_id"] for o in row["old_incarnations"]] == [ID_A]

    lookup = _json_lines(
        rlm_cli(
            "lookup", "--config", env.cfg, "--topic", TOPIC, "--partition", "0", "--offset", str(highest_a)
        ).stdout
    )[0]
    assert lookup["found"] is False and lookup["valid_ranges"]["highest_tiered_offset"] < leo_b
    lookup = _json_lines(
        rlm_cli(
            "lookup", "--config", env.cfg, "--topic", TOPIC, "--partition", "0", "--timestamp", "-2"
        ).stdout
    )[0]
    assert lookup["found"] and lookup["timestamp"] == TS["B"]

    dry = [
        r
        for r in _json_lines(rlm_cli("gc", "--config", env.cfg, "--dry-run", "--quiet").stdout)
        if "old_incarnation" in r
    ]
    assert [(r["old_incarnation"]["topic_id"], r["deleted"]) for r in dry] == [(ID_A, False)]
    assert env.manifests(ID_A)
    cfg = write_config(tmp_path / "now.toml", [env.logs], root=tmp_path / "store", old_incarnation_grace_ms=0)
    done = [
        r for r in _json_lines(rlm_cli("gc", "--config", cfg, "--quiet").stdout) if "old_incarnation" in r
    ]
    assert [(r["old_incarnation"]["topic_id"], r["deleted"]) for r in done] == [(ID_A, True)]
    assert env.keys_under(object_keys.root(TOPIC, 0, ID_A)) == [] and env.manifests(ID_B)


def test_a_restart_with_a_topic_id_asks_the_store_nothing(tmp_path: Path) -> None:
    """What the identity lookups found is kept in the state dir (identity.json): a restart that
    trusts the local state asks the store nothing and still sees the old incarnation; it asks
    again in full when the record is gone, and GC notices data appearing under the name
    (docs/remote-state.md "What a restart reads")."""
    env = Env(tmp_path)
    env.write(ID_A, "A", 300)
    assert [r.error for r in env.manager().run_once()] == [None]
    env.delete_partition()
    env.write(ID_B, "B", 300)
    assert [r.error for r in env.manager().run_once()] == [None]  # A retired by B's recovery
    counting = CountingBackend(env.backend)

    def restart() -> RemoteLogManager:
        manager = RemoteLogManager(env.settings, counting, metrics=TieringMetrics(), clock_ms=lambda: env.now)
        counting.calls.clear()
        assert [r.error for r in manager.run_once(gc=False)] == [None]
        assert (
            manager.shared.metrics.registry.get_sample_value(
                "rlm_partition_recoveries_total", {"source": "local"}
            )
            == 1
        )
        return manager

    manager = restart()
    assert counting.total == 0, counting.calls
    assert [o["topic_id"] for o in _row(manager)["old_incarnations"]] == [ID_A]

    (env.state_root / f"{NAME}={ID_B}" / IDENTITY_FILE).unlink()
    manager = restart()
    assert counting.total > 1  # asked in full once more, and remembered
    assert [o["topic_id"] for o in _row(manager)["old_incarnations"]] == [ID_A]
    manager = restart()
    assert counting.total == 0, counting.calls

    # Data appearing under the name (a replica without partition.metadata): GC sees it, and the
    # next pass recovers (asks in full) instead of trusting the record again.
    env.backend.put(object_keys.partition_prefix(TOPIC, 0, None) + "manifests/x", b"{}")
    manager = restart()
    assert counting.total == 0
    _old(manager)
    counting.calls.clear()
    assert [r.error for r in manager.run_once(gc=False)] == [None]
    assert counting.total > 1

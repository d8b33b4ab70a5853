"""A topic deleted on the broker and not re-created: its remote data goes after
``tiering.deleted_topic_grace_ms``, never before, and only when the deletion is certain
(docs/topic-identity.md "Deleted topics"). Metadata logs are written by rlm.testing.kraft, the
partition by rlm.logdir.writer.LogWriter."""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlm.config import load_settings
from rlm.formats.records import RecordSpec
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.testing.daemon import rlm_cli
from rlm.testing.kraft import MetadataLogBuilder
from rlm.tiering.converge.incarnations import DELETED_REASON, OldIncarnation
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.store import object_keys

TOPIC = "gone.t"
NAME = f"{TOPIC}-0"
GRACE_MS = 60_000


class Env:
    """One log dir with a KRaft metadata log, one store, a fake clock."""

    def __init__(self, tmp_path: Path, **tiering: Any) -> None:
        self.tmp = tmp_path
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        (self.logs / "meta.properties").write_text("version=1\nnode.id=1\n")  # this broker leads
        self.meta = MetadataLogBuilder(self.logs)
        self.topic_id = self.meta.create_topic(TOPIC, [[1]])
        tiering.setdefault("deleted_topic_grace_ms", GRACE_MS)
        self.cfg = write_config(tmp_path / "c.toml", [self.logs], root=tmp_path / "store", **tiering)
        self.backend = LocalBackend(root=str(tmp_path / "store"))
        self.now = 10_000_000
        self.root = object_keys.root(TOPIC, 0, self.topic_id)
        self.state = self.logs.parent / "logs.rlm-state" / f"{NAME}={self.topic_id}"
        with LogWriter(self.logs, TOPIC, 0, segment_bytes=1024, topic_id=self.topic_id) as w:
            for i in range(300):
                w.append([RecordSpec(1_700_000_000_000 + i, b"k", f"v-{i:05d}".encode() * 3)])

    def manager(self) -> RemoteLogManager:
        return RemoteLogManager(
            load_settings(self.cfg), self.backend, metrics=TieringMetrics(), clock_ms=lambda: self.now
        )

    def remote_keys(self) -> list[str]:
        return [i.key for i in self.backend.list(self.root)]

    def broker_deletes_partition(self, *, remove: bool = False) -> None:
        """What Kafka does: rename the dir ``<name>.<uniq>-delete``, later remove it."""
        gone = self.logs / f"{NAME}.0123456789abcdef0123456789abcdef-delete"
        (self.logs / NAME).rename(gone)
        if remove:
            shutil.rmtree(gone)

    def marker(self) -> dict[str, Any]:
        doc = json.loads(
            self.backend.read(object_keys.marker_key(TOPIC, 0, object_keys.RETIRED_MARKER, self.topic_id))
        )
        assert isinstance(doc, dict)
        return doc


@pytest.fixture
def make_env(tmp_path: Path) -> Iterator[Callable[..., Env]]:
    envs: list[Env] = []

    def make(**tiering: Any) -> Env:
        envs.append(Env(tmp_path, **tiering))
        return envs[-1]

    yield make
    for env in envs:
        env.meta.close()


def _gc(manager: RemoteLogManager, *, dry_run: bool = False) -> list[OldIncarnation]:
    found: list[OldIncarnation] = []
    manager.collect_garbage(dry_run=dry_run, deleted=found)
    return found


def _waiting_metrics(manager: RemoteLogManager) -> tuple[float | None, ...]:
    """rlm_deleted_topic_{partitions,bytes}_waiting and the next deletion (epoch seconds)."""
    get = manager.shared.metrics.registry.get_sample_value
    return tuple(
        get(f"rlm_deleted_topic_{name}")
        for name in ("partitions_waiting", "bytes_waiting", "next_delete_timestamp_seconds")
    )


@pytest.mark.parametrize("remove", [False, True], ids=["delete-dir", "dir-gone"])
def test_deleted_topic_is_marked_kept_for_the_grace_then_deleted(
    make_env: Callable[..., Env], remove: bool
) -> None:
    env = make_env()
    manager = env.manager()
    manager.run_once()
    tiered = env.remote_keys()
    assert any("/manifests/" in k for k in tiered) and env.state.is_dir()
    assert _gc(manager) == []  # alive: nothing to do

    env.meta.delete_topic(TOPIC)
    env.broker_deletes_partition(remove=remove)
    assert [(o.topic_id, o.retired_ms) for o in _gc(manager, dry_run=True)] == [(env.topic_id, None)]
    assert env.remote_keys() == tiered  # a dry run marks nothing

    [old] = _gc(manager)
    assert old.retired_ms == env.now and old.delete_after_ms == env.now + GRACE_MS and not old.deleted
    assert old.objects == len(tiered) and old.prefix == env.root
    assert env.marker()["reason"] == DELETED_REASON
    [waiting] = manager.deleted.status()  # GET /v1/deleted-topics
    assert (waiting["topic"], waiting["partition"], waiting["topic_id"]) == (TOPIC, 0, env.topic_id)
    assert waiting["delete_after_ms"] == env.now + GRACE_MS and waiting["prefix"] == env.root
    assert _waiting_metrics(manager) == (1, old.bytes, (env.now + GRACE_MS) / 1000) and old.bytes > 0

    env.now += GRACE_MS - 1
    assert not any(o.deleted for o in _gc(manager))
    assert set(tiered) < set(env.remote_keys())  # everything still there, plus the marker

    # `rlm gc --dry-run` (a process of its own) lists it with its delete-after time.
    proc = rlm_cli("gc", "--config", env.cfg, "--dry-run", "--quiet")
    assert proc.returncode == 0, proc.stderr
    [line] = [json.loads(x) for x in proc.stdout.splitlines() if "deleted_topic" in x]
    assert line["deleted_topic"]["delete_after_ms"] == old.delete_after_ms and line["deleted"] is False

    env.now += 1
    [gone] = _gc(manager)
    assert gone.deleted and env.remote_keys() == [] and not env.state.exists()
    assert _gc(manager) == [] and manager.deleted.waiting == []
    assert _waiting_metrics(manager) == (0, 0, float("inf"))


def test_a_replica_moved_away_is_never_deleted(make_env: Callable[..., Env]) -> None:
    """The topic id is still in the image: the partition only left this broker."""
    env = make_env(deleted_topic_grace_ms=0)
    manager = env.manager()
    manager.run_once()
    tiered = env.remote_keys()
    shutil.rmtree(env.logs / NAME)
    env.now += 10 * GRACE_MS
    assert _gc(manager) == []
    assert env.remote_keys() == tiered


def test_a_live_partition_dir_holds_the_deletion_back(make_env: Callable[..., Env]) -> None:
    """The image lost the id but the dir is still live (the broker has not applied the removal)."""
    env = make_env(deleted_topic_grace_ms=0)
    manager = env.manager()
    manager.run_once()
    tiered = env.remote_keys()
    env.meta.delete_topic(TOPIC)
    assert _gc(manager) == []
    assert env.remote_keys() == tiered
    env.broker_deletes_partition()
    assert [o.deleted for o in _gc(manager)] == [True]
    assert env.remote_keys() == []


def test_a_crash_mid_deletion_converges(make_env: Callable[..., Env]) -> None:
    """SIGKILL after the first object went: the marker (deleted last) is still there, so the next
    GC finds the root and finishes it."""
    env = make_env(deleted_topic_grace_ms=0)
    env.manager().run_once()
    tiered = env.remote_keys()
    env.meta.delete_topic(TOPIC)
    env.broker_deletes_partition()
    proc = rlm_cli("gc", "--config", env.cfg, "--quiet", env={"RLM_CRASH_AT": "mid_root_delete"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    left = env.remote_keys()
    assert 0 < len(left) < len(tiered) + 1
    assert object_keys.marker_key(TOPIC, 0, object_keys.RETIRED_MARKER, env.topic_id) in left

    proc = rlm_cli("gc", "--config", env.cfg, "--quiet")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in proc.stdout.splitlines() if "deleted_topic" in x]
    assert [(x["deleted_topic"]["topic_id"], x["deleted"]) for x in lines] == [(env.topic_id, True)]
    assert env.remote_keys() == [] and not env.state.exists()


def test_a_deleted_topic_re_created_keeps_its_first_clock(make_env: Callable[..., Env]) -> None:
    """Marked as deleted, then re-created under the same name: the root becomes an old incarnation
    of the new topic, and the marker written first still sets its clock and grace."""
    env = make_env(old_incarnation_grace_ms=5 * GRACE_MS)
    manager = env.manager()
    manager.run_once()
    env.meta.delete_topic(TOPIC)
    env.broker_deletes_partition(remove=True)
    [marked] = _gc(manager)
    env.now += 1000
    new_id = env.meta.create_topic(TOPIC, [[1]])
    with LogWriter(env.logs, TOPIC, 0, segment_bytes=1024, topic_id=new_id) as w:
        for i in range(50):
            w.append([RecordSpec(1_700_000_000_000 + i, b"k", b"new")])
    manager.run_once()
    assert _gc(manager) == []  # a live dir of the name: the old-incarnation path's business
    [row] = [r for r in manager.status() if r["topic"] == TOPIC]
    [old] = row["old_incarnations"]
    assert old["topic_id"] == env.topic_id and old["retired_ms"] == marked.retired_ms
    assert old["delete_after_ms"] == marked.retired_ms + GRACE_MS

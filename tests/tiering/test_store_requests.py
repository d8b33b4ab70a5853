"""Request economics: the manager's store requests counted per partition and operation, with bytes,
checked against what really reached a SeaweedFS server (an HTTP proxy counting every request) and
shown in the status rows and the Prometheus registry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest
from prometheus_client import generate_latest

from rlm.cli.generate import generate_log_dir
from rlm.config import load_settings
from rlm.logdir.writer import LogWriter
from rlm.storage.api import ObjectInfo, StorageBackend
from rlm.storage.local import LocalBackend
from rlm.storage.memory import MemoryBackend
from rlm.storage.metering import MeteringBackend, RequestMeter, attributed
from rlm.storage.registry import create_backend
from rlm.storage.spread import open_spread
from rlm.storage.wrapper import WrappingBackend
from rlm.testing.configs import write_config
from rlm.testing.counting import CountingBackend
from rlm.testing.faultproxy import FaultProxy
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from tests.s3servers import S3Target
from tests.tiering.helpers import append_rolled

TOPIC = "econ"


@pytest.fixture
def proxy(s3_target: S3Target) -> Iterator[FaultProxy]:
    with FaultProxy(s3_target.endpoint) as p:
        yield p


@pytest.mark.s3
@pytest.mark.integration
@pytest.mark.parametrize("spread", [0, 2])
def test_pass_requests_match_what_reached_the_server(
    tmp_path: Path, s3_target: S3Target, proxy: FaultProxy, spread: int
) -> None:
    logs = tmp_path / "logs"
    generate_log_dir(logs, [(TOPIC, 2)], seed=3, records=300, segment_bytes=8 * 1024)
    # native conditional create: no capability probe requests outside the partitions' passes
    options = s3_target.options(endpoint_url=proxy.endpoint, conditional_create="native")
    cfg = write_config(tmp_path / "c.toml", [logs], backend="s3", options=options, prefix_spread=spread)
    metrics = TieringMetrics()
    # With a key prefix spread (docs/key-spread.md) each call of a pass is still one request; the
    # layout check when the store is opened is not a pass's, so it is left out of the comparison.
    store = open_spread(create_backend("s3", options), spread)
    opened = dict(proxy.seen)
    manager = RemoteLogManager(load_settings(cfg), store, metrics=metrics)
    results = manager.run_once()
    assert not [r.error for r in results if r.error] and sum(len(r.copied) for r in results) > 0

    meter = metrics.requests
    rows = {row["partition"]: row["store_requests"] for row in manager.status(observe=False)}
    totals = meter.totals()
    for op, http_op in (
        ("put", "put"),
        ("get", "get"),
        ("list", "list"),
        ("head", "head"),
        ("delete", "delete"),
    ):
        assert totals[op] == proxy.seen[http_op] - opened.get(http_op, 0), (op, totals, dict(proxy.seen))
    assert totals["put"] > 0 and totals["list"] > 0
    for p in (0, 1):
        assert rows[p]["put"] > 0, rows
    # everything the passes did is attributed to a partition
    assert sum(rows[p]["put"] for p in (0, 1)) == totals["put"]
    assert sum(rows[p]["bytes_sent"] for p in (0, 1)) == totals["bytes_sent"] > 0
    text = generate_latest(metrics.registry).decode()
    put0 = float(rows[0]["put"])
    assert f'rlm_store_requests_total{{op="put",partition="0",topic="{TOPIC}"}} {put0}' in text
    assert f'rlm_store_request_bytes_total{{direction="sent",op="put"}} {float(totals["bytes_sent"])}' in text


def test_bytes_and_attribution() -> None:
    meter = RequestMeter()
    b = MeteringBackend(MemoryBackend(), meter)
    b.put("t-3/manifests/00000000000000000000.json", b"12345")
    assert b.read("t-3/manifests/00000000000000000000.json", 1, 3) == b"23"
    b.head("t-3/manifests/00000000000000000000.json")
    list(b.list("t-3/"))
    b.delete("t-3/x/y")
    with attributed("other", 7):
        b.put("scratch", b"abc")
    list(b.list(""))  # no partition in the key, no context: unattributed
    assert meter.row("t", 3) == {
        "put": 0,
        "get": 0,
        "list": 0,
        "head": 0,
        "delete": 0,
        "bytes_sent": 0,
        "bytes_received": 0,
    }  # no attribute function
    assert meter.row("other", 7) == {
        "put": 1,
        "get": 0,
        "list": 0,
        "head": 0,
        "delete": 0,
        "bytes_sent": 3,
        "bytes_received": 0,
    }
    assert meter.totals() == {
        "put": 2,
        "get": 1,
        "list": 2,
        "head": 1,
        "delete": 1,
        "bytes_sent": 8,
        "bytes_received": 2,
    }
    keyed = TieringMetrics().requests  # the tiering layer's meter knows the key layout
    kb = MeteringBackend(MemoryBackend(), keyed)
    kb.put("t-3/manifests/00000000000000000000.json", b"12345")
    kb.read("t-3/manifests/00000000000000000000.json")
    assert keyed.row("t", 3)["put"] == 1 and keyed.row("t", 3)["bytes_received"] == 5


class _StamplessPuts(WrappingBackend):
    """A ``local`` store whose creates answer the size only: neither an ETag nor the mtime its
    listing shows."""

    def __init__(self, inner: StorageBackend) -> None:
        super().__init__()
        self.inner = inner

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        info = super()._put(key, stream, if_absent)
        return ObjectInfo(info.key, info.size)


@pytest.mark.parametrize("answered", [False, True])
def test_gc_after_a_restart_reads_each_manifest_once_not_once_per_process(
    tmp_path: Path, answered: bool
) -> None:
    """A manifest this node uploaded is in its snapshot under the stamp its create was answered.
    When that is not what a listing shows (a create answered with the size only), the first GC
    after a restart reads it to learn one; with ``save_stamps`` (``rlm run --once`` and the daemon, which
    own the state dir) the stamps go into the snapshot, so the next process's GC lists and reads no
    manifest again. A ``local`` store answers its listing's stamp: no GC reads one
    (docs/operations.md "GC")."""
    logs = tmp_path / "logs"
    generate_log_dir(logs, [(TOPIC, 2)], seed=3, records=300, segment_bytes=8 * 1024)
    cfg = write_config(tmp_path / "c.toml", [logs], root=tmp_path / "store")
    settings = load_settings(cfg)
    store: StorageBackend = LocalBackend(root=str(tmp_path / "store"))
    copied = RemoteLogManager(settings, store if answered else _StamplessPuts(store)).run_once(gc=False)
    assert sum(len(r.copied) for r in copied) > 2

    def gc_in_a_new_process(save_stamps: bool) -> set[str]:
        counting = CountingBackend(LocalBackend(root=str(tmp_path / "store")))
        manager = RemoteLogManager(settings, counting)
        assert all(r.idle or not r.copied for r in manager.run_once(gc=False))
        counting.ranges.clear()
        manager.collect_garbage(save_stamps=save_stamps)
        return {key for key, _s, _e in counting.ranges if "/manifests/" in key}

    every = {i.key for i in LocalBackend(root=str(tmp_path / "store")).list("") if "/manifests/" in i.key}
    assert len(every) > 2
    if answered:
        assert gc_in_a_new_process(save_stamps=False) == set()
        return
    assert gc_in_a_new_process(save_stamps=False) == every  # `rlm gc` beside a daemon: saves nothing
    assert gc_in_a_new_process(save_stamps=True) == every  # learns the stamps, saves them
    assert gc_in_a_new_process(save_stamps=True) == set()
    assert gc_in_a_new_process(save_stamps=False) == set()


def test_gc_lists_a_partition_with_a_topic_id_three_times(tmp_path: Path) -> None:
    """GC of a partition with a topic id (docs/operations.md "GC"): one listing of its id roots
    serves both its abandoned attempts and the other incarnations, then its manifests, then the
    name-only root — 3 LISTs (it was 4: the attempts were listed apart from the id roots)."""
    from rlm.formats.partition_metadata import format_partition_metadata

    logs = tmp_path / "logs"
    generate_log_dir(logs, [(TOPIC, 1)], seed=4, records=300, segment_bytes=8 * 1024)
    (logs / f"{TOPIC}-0" / "partition.metadata").write_bytes(
        format_partition_metadata("AAAAAAAAAAAAAAAAAAAAAQ")
    )
    settings = load_settings(write_config(tmp_path / "c.toml", [logs], root=tmp_path / "store"))
    counting = CountingBackend(LocalBackend(root=str(tmp_path / "store")))
    manager = RemoteLogManager(settings, counting)
    copied = manager.run_once(gc=False)
    assert [r.error for r in copied] == [None] and copied[0].copied
    counting.calls.clear()
    manager.collect_garbage()
    assert counting.calls["list"] == 3, counting.calls


@pytest.mark.s3
@pytest.mark.integration
def test_a_leader_on_s3_reads_back_no_manifest_it_committed(tmp_path: Path, s3_target: S3Target) -> None:
    """An S3 PUT answers the ETag a listing shows: a cluster leader's next pass lists its manifests
    and reads none of those it committed, nor does the first GC of the next process."""
    writer = LogWriter(tmp_path / "logs", TOPIC, 0, segment_bytes=4096)
    try:
        ts = append_rolled([writer], 3, 1_700_000_000_000, 200)
        options = s3_target.options(conditional_create="native")
        cluster = {"node_id": 1, "leadership": "static", "leaders": {f"{TOPIC}-0": 1}}
        cfg = write_config(
            tmp_path / "c.toml", [tmp_path / "logs"], backend="s3", options=options, cluster=cluster
        )

        def manager() -> tuple[RemoteLogManager, CountingBackend]:
            counting = CountingBackend(create_backend("s3", options))
            return RemoteLogManager(load_settings(cfg), counting, metrics=TieringMetrics()), counting

        def manifests_read(counting: CountingBackend) -> set[str]:
            return {key for key, _s, _e in counting.ranges if "/manifests/0" in key}

        leader, counting = manager()
        (first,) = leader.run_once(gc=False)
        assert first.error is None and first.copied
        append_rolled([writer], 3, ts, 200)  # more rolled segments: the next pass lists and copies
        counting.ranges.clear()
        (second,) = leader.run_once(gc=False)
        assert second.error is None and second.copied
        assert manifests_read(counting) == set()

        again, counting = manager()  # a restart: its first pass and GC list, and read no manifest
        again.run_once(gc=False)
        assert manifests_read(counting) == set()
        counting.ranges.clear()
        again.collect_garbage(save_stamps=False)
        assert counting.calls["list"] > 0 and manifests_read(counting) == set()
    finally:
        writer.close()

"""Every offset / timestamp answer of ../shared/fixtures/expected.json, reproduced by ``rlm lookup``
from the local tier, and again from the remote tier after ``rlm run --once`` tiered the segments
and their local .log/.index/.timeindex were deleted.

All queries go through the real CLI command in-process (click's runner: argument parsing, config
loading, JSON output); a representative subset also runs ``python -m rlm lookup`` as a subprocess.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rlm.cli.main import main
from rlm.formats import naming
from rlm.logdir.discovery import list_segments
from rlm.testing.daemon import rlm_cli
from tests.hdfsservers import HdfsTarget
from tests.lookup.helpers import (
    ARTHUR,
    BruteLog,
    copy_fixture_logs,
    delete_local_segments,
    expected_ts_answer,
    fixture_partitions,
    write_config,
)
from tests.tiering.helpers import copy_partition_as

pytestmark = pytest.mark.integration

# (partition dir, kind, value): compacted gaps, two segments, snappy, gzip, transactions, past the end.
SUBPROCESS_QUERIES = [
    ("__consumer_offsets-19", "offset", 0),
    ("__consumer_offsets-19", "offset", 258466),
    ("__consumer_offsets-19", "timestamp", 1765403766081),
    ("__cluster_metadata-0", "offset", 6357),
    ("__cluster_metadata-0", "timestamp", 1765394860694),
    ("oms_order_created-1", "offset", 88238),
    ("oms_order_created-1", "timestamp", 1766799398881),
    ("oms_order_created-1", "timestamp", 1766802778447),
    ("topic-logx-001-1", "timestamp", 1726604049362),
    ("_confluent-ksql-default__command_topic-0", "offset", 2),
]


class Env:
    def __init__(
        self, fixtures_dir: Path, tmp: Path, remote: tuple[str, dict[str, Any]] | None = None
    ) -> None:
        self.dirs = copy_fixture_logs(fixtures_dir, tmp / "logs")
        self.store = tmp / "store"
        # __consumer_offsets is looked up too (the compacted cases); __cluster_metadata never is
        self.config = write_config(
            tmp / "rlm.toml", self.dirs, store=self.store, serve_internal_topics=True, remote=remote
        )
        self.brute = {
            f"{d.name}/{p.name}": BruteLog.scan(p) for d in self.dirs for p in d.iterdir() if p.is_dir()
        }
        self.runner = CliRunner()

    def part_dir(self, pname: str) -> Path:
        return next(d / pname for d in self.dirs if (d / pname).is_dir())

    def lookup(self, topic: str, partition: int, kind: str, value: int) -> dict[str, Any]:
        res = self.runner.invoke(
            main,
            [
                "lookup",
                "--config",
                str(self.config),
                "--topic",
                topic,
                "--partition",
                str(partition),
                f"--{kind}",
                str(value),
            ],
        )
        assert res.exit_code == 0, (res.output, res.exception)
        doc: dict[str, Any] = json.loads(res.output)
        return doc

    def refused(self, topic: str, partition: int, kind: str, value: int) -> None:
        """The KRaft metadata log is never served (docs/visibility.md, "Internal topics")."""
        args = ["lookup", "--config", str(self.config), "--topic", topic, "--partition", str(partition)]
        res = self.runner.invoke(main, [*args, f"--{kind}", str(value)])
        assert res.exit_code == 1 and "not served" in res.output, res.output


def _check_offset(
    env: Env, pname: str, seg: dict[str, Any], q: dict[str, Any], doc: dict[str, Any], tier: str
) -> None:
    where = f"{pname} offset {q['offset']} ({tier}): {doc}"
    if q["batch_base_offset"] is None:  # past the end of the log
        assert doc["found"] is False, where
        assert doc["valid_ranges"]["log_end_offset"] == seg["last_offset"] + 1, where
        return
    assert doc["found"] is True and doc["tier"] == tier, where
    batch = {"base_offset": q["batch_base_offset"], "last_offset": q["batch_last_offset"]}
    assert doc["batch"] == batch, where
    if q["contained"]:
        assert doc["offset"] == q["offset"], where
    else:  # compacted away (or before the first batch): the next existing offset
        nxt = env.brute[pname].first_offset_ge(q["offset"])
        assert nxt is not None and doc["offset"] == nxt.offset > q["offset"], where
    assert q["batch_base_offset"] <= doc["offset"] <= q["batch_last_offset"], where
    rec = env.brute[pname].first_offset_ge(q["offset"])
    assert rec is not None and doc["timestamp"] == rec.timestamp, where
    if tier == "local":
        assert Path(doc["location"]["file"]).name == seg["file"], where
        assert doc["location"]["position"] == q["batch_pos"], where
    else:
        assert "#" in doc["location"]["rdi"] and doc["location"]["data_length"] > 0, where


def _check_timestamp(env: Env, pname: str, want: int | None, ts: int, doc: dict[str, Any], tier: str) -> None:
    where = f"{pname} ts {ts} ({tier}): {doc}"
    if want is None:
        assert doc["found"] is False and "valid_ranges" in doc, where
        return
    assert doc["found"] is True and doc["tier"] == tier and doc["offset"] == want, where
    rec = env.brute[pname].first_offset_ge(want)
    assert rec is not None and rec.offset == want and doc["timestamp"] == rec.timestamp >= ts, where


def _tier_of(topic: str, tier: str) -> str:
    """Kafka's internal logs are never tiered: after a pass they still answer from the local tier."""
    return "local" if naming.is_internal_topic(topic) else tier


def _all_queries(env: Env, expected: dict[str, Any], tier: str) -> int:
    n = 0
    for src, name, topic, partition, segs in fixture_partitions(expected):
        pname = f"{src}/{name}"
        part_tier = _tier_of(topic, tier)
        for seg in segs:
            if not naming.is_served_topic(topic, internal=True):
                n += _refused_queries(env, topic, partition, seg)
                continue
            for q in seg["offset_queries"]:
                doc = env.lookup(topic, partition, "offset", q["offset"])
                _check_offset(env, pname, seg, q, doc, part_tier)
                n += 1
            for q in seg["timestamp_queries"]:
                want = expected_ts_answer(segs, seg, q)
                doc = env.lookup(topic, partition, "timestamp", q["ts"])
                _check_timestamp(env, pname, want, q["ts"], doc, part_tier)
                n += 1
    return n


def _refused_queries(env: Env, topic: str, partition: int, seg: dict[str, Any]) -> int:
    for q in seg["offset_queries"]:
        env.refused(topic, partition, "offset", q["offset"])
    for q in seg["timestamp_queries"]:
        env.refused(topic, partition, "timestamp", q["ts"])
    return len(seg["offset_queries"]) + len(seg["timestamp_queries"])


def _subprocess_queries(env: Env, expected: dict[str, Any], tier: str) -> None:
    parts = {name: (src, topic, p, segs) for src, name, topic, p, segs in fixture_partitions(expected)}
    for name, kind, value in SUBPROCESS_QUERIES:
        src, topic, partition, segs = parts[name]
        pname = f"{src}/{name}"
        part_tier = _tier_of(topic, tier)
        proc = rlm_cli(
            "lookup", "--config", env.config, "--topic", topic, "--partition", partition, f"--{kind}", value
        )
        if not naming.is_served_topic(topic, internal=True):
            assert proc.returncode == 1 and "not served" in proc.stderr and not proc.stdout, proc.stderr
            continue
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["topic"] == topic and doc["partition"] == partition
        key = "offset" if kind == "offset" else "ts"
        matches = [(seg, q) for seg in segs for q in seg[f"{kind}_queries"] if q[key] == value]
        assert matches, f"{pname} {kind} {value} is not in expected.json"
        seg, q = matches[0]
        if kind == "offset":
            _check_offset(env, pname, seg, q, doc, part_tier)
        else:
            _check_timestamp(env, pname, expected_ts_answer(segs, seg, q), value, doc, part_tier)


def test_every_expected_answer_from_the_local_tier(
    fixtures_dir: Path, expected: dict[str, Any], tmp_path: Path
) -> None:
    env = Env(fixtures_dir, tmp_path)
    assert _all_queries(env, expected, "local") == 199
    _subprocess_queries(env, expected, "local")


def test_every_expected_answer_from_the_remote_tier(
    fixtures_dir: Path, expected: dict[str, Any], tmp_path: Path
) -> None:
    _every_answer_from_the_remote_tier(Env(fixtures_dir, tmp_path), expected)


@pytest.mark.hdfs
def test_every_expected_answer_from_hdfs(
    fixtures_dir: Path, expected: dict[str, Any], tmp_path: Path, hdfs_target: HdfsTarget
) -> None:
    """The same answers with the remote tier on a live HDFS (WebHDFS)."""
    _every_answer_from_the_remote_tier(Env(fixtures_dir, tmp_path, ("hdfs", hdfs_target.options())), expected)


def _every_answer_from_the_remote_tier(env: Env, expected: dict[str, Any]) -> None:
    proc = rlm_cli("run", "--config", env.config, "--once", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["errors"] == {}
    for d in env.dirs:
        for part in sorted(p for p in d.iterdir() if p.is_dir() and any(p.glob("*.log"))):
            if naming.is_internal_topic(naming.parse_partition_dir(part.name)[0]):
                assert not any(part.glob("*" + naming.REMOTE_LOG_INDEX)), part  # never tiered
                continue
            deleted = delete_local_segments(part)
            assert deleted, part
            remaining = list_segments(part)
            assert len(remaining) == 1 and remaining[0].size == 0  # only the empty active segment
    # The ranges say so too: nothing local is left below the log end.
    doc = env.lookup("oms_order_created", 1, "offset", 81908)
    assert doc["tier"] == "remote"
    status = rlm_cli("status", "--config", env.config)
    rows = {f"{r['topic']}-{r['partition']}": r for r in json.loads(status.stdout)}
    row = rows["oms_order_created-1"]
    assert row["local_log_start_offset"] == row["log_end_offset"] == 94646
    assert row["remote_log_start_offset"] == 81908 and row["highest_tiered_offset"] == 94645
    assert _all_queries(env, expected, "remote") == 199
    _subprocess_queries(env, expected, "remote")


def test_compacted_offsets_resolve_to_the_next_existing_offset(fixtures_dir: Path, tmp_path: Path) -> None:
    """The README's worked answers for the compacted __consumer_offsets-19, both tiers. The
    internal log itself is never tiered, so the remote tier is shown on a user topic holding a
    copy of its files (``offsets_copy-19``)."""
    env = Env(fixtures_dir, tmp_path)
    arthur = env.part_dir("__consumer_offsets-19").parent
    copy_partition_as(arthur, "__consumer_offsets-19", "offsets_copy-19")
    cases = {
        0: (186795, 186795),
        186796: (258480, 258466),
        258466: (258480, 258466),
        258481: (258496, 258466),
        258516: (258519, 258516),
        258522: (258522, 258516),
    }
    for tier in ("local", "remote"):
        if tier == "remote":
            assert rlm_cli("run", "--config", env.config, "--once", "--quiet").returncode == 0
            delete_local_segments(env.part_dir("offsets_copy-19"))
            delete_local_segments(env.part_dir("__consumer_offsets-19"))
        for topic in ("offsets_copy", "__consumer_offsets"):
            for offset, (answer, batch_base) in cases.items():
                doc = env.lookup(topic, 19, "offset", offset)
                if topic == "__consumer_offsets" and tier == "remote":  # never tiered: deleted is gone
                    assert doc["found"] is False, doc
                    continue
                got = (doc["tier"], doc["offset"], doc["batch"]["base_offset"])
                assert got == (tier, answer, batch_base), (topic, doc)
            doc = env.lookup(topic, 19, "offset", 258527)
            assert doc["found"] is False
    assert ARTHUR in str(env.part_dir("__consumer_offsets-19"))

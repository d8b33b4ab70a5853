"""One ``rlm run`` with the Kafka listener for the package's reading tests: generated partitions
(every codec; tiered, then their local segments deleted except the active one, so a consumer crosses
the tier boundary), a partition kafka-python's builder encoded, a transactional one, and the real
broker fixtures (rolled, so wholly remote)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.logdir.discovery import discover_partitions
from tests.kafka.helpers import (
    Daemon,
    Expected,
    copy_fixture_dirs,
    oracle,
    tier_then_delete,
    toml_config,
    write_kafka_python_topic,
)
from tests.tiering.helpers import roll_after_last
from tests.tiering.txn_helpers import Oracle, write_txn_log


@dataclass
class Tiered:
    daemon: Daemon
    expected: dict[tuple[str, int], Expected]
    parts: dict[tuple[str, int], Path]
    log_dirs: list[Path]
    txn: Oracle  # the transactional partition "txn-0" as read_committed / read_uncommitted see it


@pytest.fixture(scope="package")
def tiered(tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Tiered]:
    root = tmp_path_factory.mktemp("kafka")
    gen = root / "gen"
    generate_log_dir(gen, [("gen", 2), ("gen.other", 1)], seed=11, records=1200, segment_bytes=16 * 1024)
    write_kafka_python_topic(gen)
    write_txn_log(gen, "txn", 0, steps=400)
    fixture_dirs = copy_fixture_dirs(fixtures_dir, root / "fixtures")
    log_dirs = [gen, *fixture_dirs]
    parts = {(p.topic, p.partition): p.path for p in discover_partitions(log_dirs)}
    for path in parts.values():
        if path.parent != gen and any(path.glob("*.log")):
            roll_after_last(path)
    expected = {key: oracle(path, *key) for key, path in parts.items()}
    txn = Oracle.of(parts[("txn", 0)], expected[("txn", 0)].high_watermark)
    config = toml_config(
        root / "rlm.toml",
        log_dirs,
        root / "store",
        {"listen": "127.0.0.1:0", "idle_timeout_ms": 2000, "max_request_bytes": 1 << 20, "max_wait_ms": 2000},
        # the fixtures' __consumer_offsets are read as a client with exclude.internal.topics=false
        # would (docs/visibility.md, "Internal topics"); __cluster_metadata stays unserved
        server={"serve_internal_topics": True},
    )
    for key, bases in tier_then_delete(config, parts).items():
        expected[key].deleted_bases = bases
    daemon = Daemon(config)
    try:
        yield Tiered(daemon, expected, parts, log_dirs, txn)
    finally:
        daemon.stop()

"""``rlm generate``: a demo log dir that rlm's own discovery and readers accept entirely."""

from __future__ import annotations

import hashlib
from pathlib import Path

from click.testing import CliRunner

from rlm.cli.main import main
from rlm.formats.compression import Compression
from rlm.logdir.discovery import discover_partitions, eligible_segments, list_segments, partition_state
from rlm.logdir.segment import LogSegment
from tests.logdir.test_writer import assert_kafka_index_invariants


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["generate", *args])
    return result.exit_code, result.output


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def test_generate_then_discover_and_read_everything(tmp_path: Path) -> None:
    out = tmp_path / "kafka-logs"
    code, output = _run("--out", str(out), "--seed", "3")
    assert code == 0, output
    assert "wrote 5 partitions" in output
    parts = discover_partitions([out])
    assert {p.name for p in parts} == {
        "orders-eu.v1-0",
        "orders-eu.v1-1",
        "click_stream-0",
        "click_stream-1",
        "metrics.cpu-load_1m-0",
    }
    codecs: set[Compression] = set()
    lagging = 0
    for part in parts:
        segments = list_segments(part)
        assert len(segments) >= 3
        expected_offset = 0
        for files in segments:
            with LogSegment.open(files) as seg:
                for batch in seg.batches():  # verifies every CRC
                    codecs.add(batch.compression)
                    for record in seg.read_records(batch):
                        assert record.offset == expected_offset
                        expected_offset += 1
        assert expected_offset == 1500
        assert_kafka_index_invariants(part.path, 4096)
        state = partition_state(part)
        assert state.high_watermark is not None and state.recovery_point == 1500
        hw_eligible = eligible_segments(part, state, "high-watermark")
        rolled = eligible_segments(part, state, "rolled")
        assert len(rolled) == len(segments) - 1
        if state.high_watermark < 1500:
            lagging += 1
            assert len(hw_eligible) == len(rolled) - 1  # the lagging HW holds one segment back
        else:
            assert hw_eligible == rolled
        assert (part.path / "leader-epoch-checkpoint").read_text().splitlines()[1] == "2"
    assert codecs == set(Compression)
    assert lagging == 2


def test_generate_is_deterministic_by_seed(tmp_path: Path) -> None:
    runs = {}
    for name, seed in (("a", "5"), ("b", "5"), ("c", "6")):
        code, output = _run("--out", str(tmp_path / name), "--seed", seed, "--records", "300")
        assert code == 0, output
        runs[name] = _digest(tmp_path / name)
    assert runs["a"] == runs["b"]
    assert runs["a"] != runs["c"]


def test_generate_custom_topics_and_errors(tmp_path: Path) -> None:
    out = tmp_path / "logs"
    code, output = _run("--out", str(out), "--topic", "a-b.c_d:3", "--topics", "solo", "--records", "50")
    assert code == 0, output
    assert sorted(p.name for p in discover_partitions([out])) == [
        "a-b.c_d-0",
        "a-b.c_d-1",
        "a-b.c_d-2",
        "solo-0",
    ]
    code, output = _run("--out", str(out), "--topic", "solo")  # partition already written
    assert code == 1 and "already has segments" in output
    code, output = _run("--out", str(tmp_path / "x"), "--topic", "bad/name")
    assert code == 2 and "bad/name" in output
    code, output = _run("--out", str(tmp_path / "y"), "--topic", "t:zero")
    assert code == 2

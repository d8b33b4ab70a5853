"""``rlm restore`` (rlm.jobs.restore, docs/restore.md): real broker fixtures and LogWriter logs of
every codec are tiered by the real copy protocol, every local segment is deleted, and the restored
partition directories are compared with the originals — byte for byte (segments, the brokers'
indexes), through rlm's own reader and broker-file checks, and record by record with kafka-python's
independent codec. Then: a real S3 server, ``--from-offset``/``--from-timestamp``, a re-created
topic, a corrupt stored object, an existing target, and ``rlm`` itself reading the restored dir."""

from __future__ import annotations

import base64
import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from rlm.config import Settings, settings_from_mapping
from rlm.errors import InvalidArgumentError, KeyNotFoundError, RlmError
from rlm.formats import naming
from rlm.formats.checkpoint import (
    format_offset_checkpoint,
    parse_leader_epoch_checkpoint,
    parse_offset_checkpoint,
)
from rlm.formats.partition_metadata import format_partition_metadata
from rlm.formats.records import RecordSpec, iter_batches
from rlm.jobs.restore import StartAt, restore
from rlm.logdir.indexcheck import parse_checked
from rlm.logdir.scan import (
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    PARTITION_METADATA,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    discover_partitions,
    list_segments,
)
from rlm.logdir.writer import LogWriter
from rlm.storage.registry import create_backend, open_backend
from rlm.testing.configs import write_config
from rlm.tiering import keys
from rlm.tiering.manager import RemoteLogManager
from tests.jobs.helpers import corrupt_one_object
from tests.lookup.helpers import delete_local_segments
from tests.spark.conftest import CODECS, copy_fixture_dirs, kafka_python_records, tier, write_generated
from tests.tiering.helpers import rlm_cli

SEGMENT_SUFFIXES = (naming.LOG, naming.INDEX, naming.TIME_INDEX)


def _settings(log_dirs: list[Path], store: dict[str, Any], **tiering: Any) -> Settings:
    tiering.setdefault("gc_grace_ms", 0)
    return settings_from_mapping(
        {
            "log": {"dirs": [str(d) for d in log_dirs]},
            "remote": store,
            "tiering": tiering,
            "topics": {"follow_kafka_configs": False},  # the fixtures' 1-day retention.ms would delete
            "cluster": {"leadership": "always"},
        }
    )


def _tiered(settings: Settings) -> set[str]:
    """The partition dir names the store holds data of (any root)."""
    remote = settings.remote
    backend = open_backend(remote.backend, remote.options, remote.prefix_spread)
    roots = (keys.parse_root(info.key) for info in backend.list(""))
    return {f"{r.topic}-{r.partition}" for r in roots if r is not None}


def _originals(log_dirs: list[Path], tiered: set[str]) -> dict[str, dict[str, bytes]]:
    """Per tiered partition dir name: every rolled segment's files (the active one stays local)."""
    out: dict[str, dict[str, bytes]] = {}
    for part in discover_partitions(log_dirs):
        if part.name not in tiered:
            continue
        files: dict[str, bytes] = {}
        for seg in list_segments(part)[:-1]:
            for suffix in SEGMENT_SUFFIXES:
                path = part.path / naming.segment_file_name(seg.base_offset, suffix)
                if path.exists():
                    files[path.name] = path.read_bytes()
        if files:
            out[part.name] = files
    return out


def _records(log_dirs: list[Path]) -> dict[str, list[Any]]:
    return {p.name: kafka_python_records(p.path) for p in discover_partitions(log_dirs)}


def _delete_local(log_dirs: list[Path]) -> None:
    for part in discover_partitions(log_dirs):
        delete_local_segments(part.path, keep_last=1)


def _check_loadable(part_dir: Path) -> None:
    """rlm's reader opens every segment: each batch CRC-valid, whole batches to the end, and
    the indexes pass rlm's broker-file checks against the batches (docs/broker-files.md)."""
    segments = list_segments(part_dir)
    assert segments
    for seg in segments:
        data = seg.log.read_bytes()
        batches = list(iter_batches(data, verify_crc=True))
        assert batches and batches[-1].position + batches[-1].size == len(data)
        assert batches[0].base_offset >= seg.base_offset
        for kind, path in (("index", seg.index), ("timeindex", seg.time_index)):
            assert path is not None and path.exists(), (seg.log, kind)
            parse_checked(kind, seg.base_offset, path.read_bytes(), batches)  # type: ignore[arg-type]


def _checkpoint(out: Path, name: str) -> dict[tuple[str, int], int]:
    return parse_offset_checkpoint((out / name).read_bytes()).entries


# --- the real brokers' fixtures -------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixtures_restored(fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("restore-fixtures")
    dirs = copy_fixture_dirs(fixtures_dir, root / "logs")
    settings = _settings(dirs, {"backend": "local", "options": {"root": str(root / "store")}})
    tier(settings)
    originals, records = _originals(dirs, _tiered(settings)), _records(dirs)
    _delete_local(dirs)
    out = root / "restored"
    backend = create_backend("local", {"root": str(root / "store")})
    results = {}
    for topic in sorted({name.rpartition("-")[0] for name in originals}):
        results[topic] = restore(settings, backend, topic, out / topic).to_json()
    return {"dirs": dirs, "originals": originals, "records": records, "out": out, "results": results}


def test_fixture_segments_and_broker_indexes_restore_byte_for_byte(fixtures_restored: dict[str, Any]) -> None:
    originals: dict[str, dict[str, bytes]] = fixtures_restored["originals"]
    out: Path = fixtures_restored["out"]
    assert {"oms_order_status_changed-0", "oms_order_created-1", "_schemas-0"} <= set(originals)
    for name, files in originals.items():
        restored = out / name.rpartition("-")[0] / name
        got = {p.name: p.read_bytes() for p in restored.iterdir() if p.suffix in SEGMENT_SUFFIXES}
        logs = {f for f in files if f.endswith(naming.LOG)}
        assert {f for f in got if f.endswith(naming.LOG)} == logs and files.keys() <= got.keys(), name
        for file_name, data in files.items():
            assert got[file_name] == data, f"{name}/{file_name} differs"
        # Where the broker left no index (one fixture's upstream lacks them) rlm's rebuild is there.
        assert len(got) == 3 * len(logs)


def test_fixture_restore_opens_and_decodes_like_the_original(
    fixtures_restored: dict[str, Any], fixtures_dir: Path
) -> None:
    out: Path = fixtures_restored["out"]
    for name, want in fixtures_restored["records"].items():
        if name not in fixtures_restored["originals"]:
            continue
        topic = name.rpartition("-")[0]
        restored = out / topic / name
        _check_loadable(restored)
        assert kafka_python_records(restored) == want, name  # HW from the restored checkpoint
        source = next((fixtures_dir / "kafka-logs").glob(f"*/{name}"))
        end = (
            max(
                b.last_offset
                for b in iter_batches(
                    b"".join(
                        d for f, d in fixtures_restored["originals"][name].items() if f.endswith(naming.LOG)
                    )
                )
            )
            + 1
        )
        # The broker's own partition.metadata and leader-epoch cache come back as they were, the
        # cache as Kafka trims it to the log (truncateFromEnd: no epoch starting at its end).
        assert (restored / PARTITION_METADATA).read_bytes() == (source / PARTITION_METADATA).read_bytes()
        epochs = parse_leader_epoch_checkpoint((source / LEADER_EPOCH_CHECKPOINT).read_bytes()).entries
        assert parse_leader_epoch_checkpoint((restored / LEADER_EPOCH_CHECKPOINT).read_bytes()).entries == [
            e for e in epochs if e.start_offset < end
        ]
        key = (topic, int(name.rpartition("-")[2]))
        assert _checkpoint(out / topic, REPLICATION_OFFSET_CHECKPOINT)[key] == end
        assert _checkpoint(out / topic, RECOVERY_POINT_CHECKPOINT)[key] == end
        assert key not in _checkpoint(out / topic, LOG_START_OFFSET_CHECKPOINT)  # starts at its base


def test_compacted_fixture_segment_keeps_its_base_below_its_first_batch(
    tmp_path: Path, fixtures_dir: Path
) -> None:
    """``__consumer_offsets-19``'s only segment is named 0 and starts with offset 186795 (the
    cleaner kept the base): restored under the same name with the broker's indexes."""
    from tests.tiering.helpers import copy_partition_as

    logs = copy_fixture_dirs(fixtures_dir, tmp_path / "logs")
    arthur = next(d for d in logs if d.name.startswith("Arthur"))
    copy_partition_as(arthur, "__consumer_offsets-19", "offsets.copy-19")
    settings = _settings(
        [arthur],
        {"backend": "local", "options": {"root": str(tmp_path / "store")}},
    )
    tier(settings)
    source = arthur / "offsets.copy-19"
    original = {p.name: p.read_bytes() for p in source.iterdir() if p.name.startswith("0" * 20)}
    want = kafka_python_records(source)
    delete_local_segments(source, keep_last=1)
    backend = create_backend("local", {"root": str(tmp_path / "store")})
    restore(settings, backend, "offsets.copy", tmp_path / "out")
    restored = tmp_path / "out" / "offsets.copy-19"
    for file_name in (naming.segment_file_name(0, s) for s in SEGMENT_SUFFIXES):
        assert (restored / file_name).read_bytes() == original[file_name]
    _check_loadable(restored)
    assert kafka_python_records(restored) == want and want[0][0] == 186795


# --- generated logs, every codec ------------------------------------------------------------------


def _generated(root: Path, store: dict[str, Any]) -> tuple[Settings, list[Path]]:
    logs = root / "logs"
    logs.mkdir(parents=True)
    for p, codec in enumerate(CODECS):
        write_generated(logs, "gen", p, codec, seed=p, log_append_time=(p == 4))
    settings = _settings([logs], store, index_entry_bytes=8192)
    tier(settings)
    return settings, [logs]


def _assert_restored(
    out: Path, originals: dict[str, dict[str, bytes]], records: dict[str, list[Any]], result: dict[str, Any]
) -> None:
    for name, files in originals.items():
        restored = out / name
        got = {p.name: p.read_bytes() for p in restored.iterdir() if p.suffix in SEGMENT_SUFFIXES}
        assert got == files, name
        _check_loadable(restored)
        last = max(b.last_offset for f, d in files.items() if f.endswith(naming.LOG) for b in iter_batches(d))
        assert kafka_python_records(restored) == [r for r in records[name] if r[0] <= last], name
    assert result["restored_partitions"] == len(originals)


@pytest.mark.parametrize("parallelism", [1, 4])
def test_every_codec_restores_byte_for_byte_and_decodes(tmp_path: Path, parallelism: int) -> None:
    settings, dirs = _generated(tmp_path, {"backend": "local", "options": {"root": str(tmp_path / "store")}})
    originals, records = _originals(dirs, _tiered(settings)), _records(dirs)
    assert len(originals) == len(CODECS) and all(len(f) >= 6 for f in originals.values())
    _delete_local(dirs)
    backend = create_backend("local", {"root": str(tmp_path / "store")})
    read: list[int] = []
    result = restore(
        settings, backend, "gen", tmp_path / "out", parallelism=parallelism, on_bytes=read.append
    ).to_json()
    assert sum(read) == result["bytes"]  # every .log byte read once, through the progress hook
    _assert_restored(tmp_path / "out", originals, records, result)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]  # no staging left


@pytest.mark.s3
@pytest.mark.parametrize("spread", [0, 2])  # [remote] prefix_spread, docs/key-spread.md
def test_restore_from_s3(tmp_path: Path, s3_target: Any, spread: int) -> None:
    store = {"backend": "s3", "options": s3_target.options(), "prefix_spread": spread}
    settings, dirs = _generated(tmp_path, store)
    originals, records = _originals(dirs, _tiered(settings)), _records(dirs)
    _delete_local(dirs)
    cfg = write_config(
        tmp_path / "c.toml",
        dirs,
        backend="s3",
        options=s3_target.options(),
        topics={"follow_kafka_configs": False},
        cluster={"leadership": "always"},
        prefix_spread=spread,
    )
    proc = rlm_cli("restore", "--config", cfg, "--topic", "gen", "--out", tmp_path / "out")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    _assert_restored(tmp_path / "out", originals, records, json.loads(proc.stdout))


# --- where the restored log starts and ends -------------------------------------------------------


def _segments_of(files: dict[str, bytes]) -> list[tuple[int, int, int, bytes]]:
    """(base, last offset, max timestamp, bytes) of each original ``.log``, in offset order."""
    out = []
    for name in sorted(f for f in files if f.endswith(naming.LOG)):
        batches = list(iter_batches(files[name]))
        out.append(
            (
                naming.parse_base_offset(name),
                batches[-1].last_offset,
                max(b.max_timestamp for b in batches),
                files[name],
            )
        )
    return out


@pytest.fixture(scope="module")
def gen_tiered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every codec tiered, every local rolled segment deleted (read-only)."""
    root = tmp_path_factory.mktemp("restore-gen")
    settings, dirs = _generated(root, {"backend": "local", "options": {"root": str(root / "store")}})
    originals, records = _originals(dirs, _tiered(settings)), _records(dirs)
    _delete_local(dirs)
    return {
        "settings": settings,
        "originals": originals,
        "records": records,
        "backend": create_backend("local", {"root": str(root / "store")}),
    }


def test_from_offset_starts_at_the_segment_holding_it(gen_tiered: dict[str, Any], tmp_path: Path) -> None:
    segments = _segments_of(gen_tiered["originals"]["gen-1"])
    base, last = segments[2][0], segments[2][1]
    assert last > base + 2
    result = restore(
        gen_tiered["settings"],
        gen_tiered["backend"],
        "gen",
        tmp_path,
        partitions=[1],
        start=StartAt(offset=base + 2),
    ).to_json()
    restored = tmp_path / "gen-1"
    assert sorted(p.name for p in restored.glob("*.log")) == [
        naming.segment_file_name(s[0], naming.LOG) for s in segments[2:]
    ]
    for s in segments[2:]:
        assert (restored / naming.segment_file_name(s[0], naming.LOG)).read_bytes() == s[3]
    _check_loadable(restored)
    assert kafka_python_records(restored) == [
        r for r in gen_tiered["records"]["gen-1"] if base <= r[0] <= segments[-1][1]
    ]
    assert ("gen", 1) not in _checkpoint(tmp_path, LOG_START_OFFSET_CHECKPOINT)  # the data starts at base
    [row] = result["partitions"]
    assert (row["log_start_offset"], row["log_end_offset"]) == (base, segments[-1][1] + 1)
    assert list(tmp_path.iterdir()) and not (tmp_path / "gen-0").exists()


def test_from_timestamp_starts_at_the_first_segment_with_a_record_that_recent(
    gen_tiered: dict[str, Any], tmp_path: Path
) -> None:
    segments = _segments_of(gen_tiered["originals"]["gen-3"])
    assert len(segments) >= 3
    ts = segments[-2][2]  # timestamps go backwards too: an earlier segment may hold one as recent
    first = next(i for i, s in enumerate(segments) if s[2] >= ts)
    restore(
        gen_tiered["settings"],
        gen_tiered["backend"],
        "gen",
        tmp_path,
        partitions=[3],
        start=StartAt(timestamp=ts),
    )
    assert sorted(p.name for p in (tmp_path / "gen-3").glob("*.log")) == [
        naming.segment_file_name(s[0], naming.LOG) for s in segments[first:]
    ]
    records = kafka_python_records(tmp_path / "gen-3")
    assert records[0][0] == segments[first][0] and any(r[1] >= ts for r in records)


def test_nothing_to_restore_is_one_clear_error_and_writes_nothing(
    gen_tiered: dict[str, Any], tmp_path: Path
) -> None:
    last = _segments_of(gen_tiered["originals"]["gen-0"])[-1][1]
    with pytest.raises(InvalidArgumentError, match=rf"gen-0: no tiered segment .* offset {last + 1}"):
        restore(
            gen_tiered["settings"],
            gen_tiered["backend"],
            "gen",
            tmp_path / "out",
            partitions=[0],
            start=StartAt(offset=last + 1),
        )
    with pytest.raises(RlmError, match=r"gen-9 is not in log.dirs"):
        restore(gen_tiered["settings"], gen_tiered["backend"], "gen", tmp_path / "out", partitions=[9])
    assert not (tmp_path / "out").exists()


def test_high_watermark_inside_a_tiered_segment_cuts_it_at_a_batch_boundary(tmp_path: Path) -> None:
    """``log.eligibility = "rolled"`` tiers rolled segments above a lagging high watermark: the
    restored log ends at the last whole batch below it, its indexes rebuilt for the cut file."""
    logs = tmp_path / "logs"
    with LogWriter(logs, "cut", 0, segment_bytes=2048, index_interval_bytes=256) as w:
        for i in range(120):
            w.append([RecordSpec(1_700_000_000_000 + i, b"k", bytes([i]) * (40 + i % 7))] * (1 + i % 3))
        bases = w.segment_base_offsets
        hw = bases[2] + 5
        w.high_watermark = hw
    want = [r for r in kafka_python_records(logs / "cut-0") if r[0] < hw]
    store = {"backend": "local", "options": {"root": str(tmp_path / "s")}}
    settings = settings_from_mapping(
        {
            "log": {"dirs": [str(logs)], "eligibility": "rolled"},
            "remote": store,
            "tiering": {"gc_grace_ms": 0},
        }
    )
    tier(settings)
    delete_local_segments(logs / "cut-0", keep_last=1)
    backend = create_backend("local", {"root": str(tmp_path / "s")})
    [row] = restore(settings, backend, "cut", tmp_path / "out").to_json()["partitions"]
    restored = tmp_path / "out" / "cut-0"
    _check_loadable(restored)
    got = kafka_python_records(restored)
    end = got[-1][0] + 1
    assert got == [r for r in want if r[0] < end] and hw - 3 <= end <= hw  # whole batches only
    assert row["cut_segments"] == 1 and row["log_end_offset"] == end
    assert _checkpoint(tmp_path / "out", REPLICATION_OFFSET_CHECKPOINT)[("cut", 0)] == end
    last_name = sorted(p.name for p in restored.glob("*.log"))[-1]
    assert last_name == naming.segment_file_name(bases[2], naming.LOG)


def test_delete_records_point_is_the_restored_log_start(tmp_path: Path) -> None:
    """A DeleteRecords point inside a tiered segment (remembered by the daemon after the broker
    forgot it): that segment is restored whole and the log start checkpoint says where the
    visible data starts."""
    settings, dirs = _generated(tmp_path, {"backend": "local", "options": {"root": str(tmp_path / "store")}})
    segments = _segments_of(_originals(dirs, _tiered(settings))["gen-2"])
    point = segments[1][0] + 3
    ckpt = dirs[0] / LOG_START_OFFSET_CHECKPOINT
    entries = parse_offset_checkpoint(ckpt.read_bytes()).entries if ckpt.exists() else {}
    entries[("gen", 2)] = point
    ckpt.write_text(format_offset_checkpoint(entries))
    manager = RemoteLogManager(settings, create_backend("local", {"root": str(tmp_path / "store")}))
    assert all(r.error is None for r in manager.run_once())  # persists the point, drops segment 0
    _delete_local(dirs)
    ckpt.write_text(format_offset_checkpoint({k: v for k, v in entries.items() if k != ("gen", 2)}))
    backend = create_backend("local", {"root": str(tmp_path / "store")})
    restore(settings, backend, "gen", tmp_path / "out", partitions=[2])
    assert sorted(p.name for p in (tmp_path / "out" / "gen-2").glob("*.log"))[0] == naming.segment_file_name(
        segments[1][0], naming.LOG
    )
    assert _checkpoint(tmp_path / "out", LOG_START_OFFSET_CHECKPOINT)[("gen", 2)] == point


# --- identity, failures, targets, the CLI ---------------------------------------------------------


def test_recreated_topic_restores_the_current_incarnation(tmp_path: Path) -> None:
    ids = {
        "A": base64.urlsafe_b64encode(bytes(range(1, 17))).decode().rstrip("="),
        "B": base64.urlsafe_b64encode(bytes(range(101, 117))).decode().rstrip("="),
    }
    logs = tmp_path / "logs"
    settings = _settings([logs], {"backend": "local", "options": {"root": str(tmp_path / "s")}})
    backend = create_backend("local", {"root": str(tmp_path / "s")})
    for tag in ("A", "B"):
        shutil.rmtree(logs / "re.t-0", ignore_errors=True)  # the topic is deleted, then re-created
        with LogWriter(logs, "re.t", 0, segment_bytes=1024, topic_id=ids[tag]) as w:
            for i in range(60 if tag == "A" else 40):
                w.append([RecordSpec(1_700_000_000_000 + i, b"k", f"{tag}-{i:04d}".encode() * 4)])
        RemoteLogManager(settings, backend).run_once()
    assert {keys.parse_root(i.key).topic_id for i in backend.list("")} == set(ids.values())  # type: ignore[union-attr]
    want = kafka_python_records(logs / "re.t-0")
    delete_local_segments(logs / "re.t-0", keep_last=1)
    restore(settings, backend, "re.t", tmp_path / "out")
    restored = tmp_path / "out" / "re.t-0"
    got = kafka_python_records(restored)
    assert got and all((r[3] or b"").startswith(b"B-") for r in got) and got == want[: len(got)]
    assert (restored / PARTITION_METADATA).read_bytes() == format_partition_metadata(ids["B"])


def _cli_env(tmp_path: Path) -> tuple[Path, Path, dict[str, dict[str, bytes]], dict[str, list[Any]]]:
    settings, dirs = _generated(tmp_path, {"backend": "local", "options": {"root": str(tmp_path / "store")}})
    originals, records = _originals(dirs, _tiered(settings)), _records(dirs)
    _delete_local(dirs)
    cfg = write_config(
        tmp_path / "c.toml",
        dirs,
        root=tmp_path / "store",
        topics={"follow_kafka_configs": False},
        cluster={"leadership": "always"},
    )
    return cfg, tmp_path / "store", originals, records


@pytest.mark.integration  # real `rlm` subprocesses
def test_cli_corrupt_object_existing_target_and_rlm_reads_the_restored_dir(tmp_path: Path) -> None:
    cfg, store, originals, records = _cli_env(tmp_path)
    out = tmp_path / "out"

    victim = corrupt_one_object(store)
    proc = rlm_cli("restore", "--config", cfg, "--topic", "gen", "--out", out)
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("rlm: error: ") and str(victim.relative_to(store)) in line and "CRC-32C" in line
    assert not out.exists()  # nothing half-written, not even the log dir it created
    victim.write_bytes(
        bytes(
            b ^ 0xFF if i == len(victim.read_bytes()) // 2 else b for i, b in enumerate(victim.read_bytes())
        )
    )  # undo the flipped byte

    (out / "gen-1").mkdir(parents=True)  # an empty directory counts as absent, and is kept on failure
    (out / "gen-3").mkdir(parents=True)
    (out / "gen-3" / "keep").write_text("mine")
    proc = rlm_cli("restore", "--config", cfg, "--topic", "gen", "--out", out)
    assert proc.returncode == 1 and "gen-3: already exists (--overwrite replaces it)" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gen-1", "gen-3"] and (out / "gen-3" / "keep").exists()

    proc = rlm_cli("restore", "--config", cfg, "--topic", "gen", "--out", out, "--overwrite")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    result = json.loads(proc.stdout)
    _assert_restored(out, originals, records, result)
    assert not (out / "gen-3" / "keep").exists()

    # rlm itself takes the restored dir as a log dir: dump a segment, look an offset up.
    seg = sorted((out / "gen-0").glob("*.log"))[1]
    proc = rlm_cli("dump", seg)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["batches"][0]["base_offset"] == naming.parse_base_offset(seg.name)
    cfg2 = write_config(tmp_path / "restored.toml", [out], root=tmp_path / "empty-store")
    offset = records["gen-0"][5][0]
    proc = rlm_cli("lookup", "--config", cfg2, "--topic", "gen", "--partition", "0", "--offset", offset)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["found"] and found["offset"] == offset and found["tier"] == "local"


def test_cli_usage_errors(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.toml", [tmp_path], root=tmp_path / "store")
    proc = rlm_cli(
        "restore",
        "--config",
        cfg,
        "--topic",
        "t",
        "--out",
        tmp_path / "o",
        "--from-offset",
        "1",
        "--from-timestamp",
        "2",
    )
    assert proc.returncode == 2 and "exclude each other" in proc.stderr
    proc = rlm_cli("restore", "--config", cfg, "--topic", "../x", "--out", tmp_path / "o")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_after_losing_the_disk_an_empty_partition_dir_is_enough(tmp_path: Path) -> None:
    """The log dir, its checkpoints and rlm's state dir are gone: an empty ``<topic>-<partition>``
    directory (with the topic's ``partition.metadata`` when it had an id) names what to restore;
    everything tiered comes back, ending at the highest tiered offset (docs/visibility.md)."""
    settings, dirs = _generated(tmp_path, {"backend": "local", "options": {"root": str(tmp_path / "store")}})
    originals, records = _originals(dirs, _tiered(settings)), _records(dirs)
    shutil.rmtree(dirs[0])
    shutil.rmtree(dirs[0].with_name(dirs[0].name + ".rlm-state"))
    (dirs[0] / "gen-4").mkdir(parents=True)
    backend = create_backend("local", {"root": str(tmp_path / "store")})
    result = restore(settings, backend, "gen", tmp_path / "out").to_json()
    _assert_restored(tmp_path / "out", {"gen-4": originals["gen-4"]}, records, result)


@pytest.mark.parametrize("encrypt", [False, True])
def test_protected_store_restores_the_plaintext_segments(tmp_path: Path, encrypt: bool) -> None:
    """Segments stored zstd-compressed per entry and AES-256-GCM-encrypted (docs/protection.md)
    come back byte-identical to the broker's files; a key missing from the configuration is one
    line naming the key id, and nothing is written."""
    from tests.protection.helpers import key_file, protection_tables

    keys_ = {"k1": key_file(tmp_path / "keys", "k1")} if encrypt else None
    store = {
        "backend": "local",
        "options": {"root": str(tmp_path / "store")},
        **protection_tables(codec="zstd", keys=keys_, active="k1" if encrypt else None),
    }
    settings, dirs = _generated(tmp_path, store)
    backend = create_backend("local", {"root": str(tmp_path / "store")})
    manifests = [json.loads(backend.read(i.key)) for i in backend.list("") if "/manifests/" in i.key]
    assert manifests and all(m["protection"]["compression"] == "zstd" for m in manifests)
    assert all(("encryption" in m["protection"]) == encrypt for m in manifests)
    originals, records = _originals(dirs, _tiered(settings)), _records(dirs)
    _delete_local(dirs)
    result = restore(settings, backend, "gen", tmp_path / "out").to_json()
    _assert_restored(tmp_path / "out", originals, records, result)
    if encrypt:
        bare = _settings(dirs, {"backend": "local", "options": {"root": str(tmp_path / "store")}})
        with pytest.raises(KeyNotFoundError, match="k1"):
            restore(bare, backend, "gen", tmp_path / "out2")
        assert not (tmp_path / "out2").exists()


@pytest.mark.integration  # real `rlm` subprocesses
def test_killed_restore_leaves_no_partition_and_the_next_one_sweeps_its_staging(tmp_path: Path) -> None:
    """SIGKILL after the third segment (RLM_CRASH_AT, a real subprocess): ``OUT`` holds no
    partition directory and no checkpoint, only hidden staging; the next restore removes it and
    writes the whole result."""
    cfg, _store, originals, records = _cli_env(tmp_path)
    out = tmp_path / "out"
    args = ("restore", "--config", cfg, "--topic", "gen", "--out", out, "--parallelism", "1")
    proc = rlm_cli(*args, env={"RLM_CRASH_AT": "restore_after_segment:3"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [p.name for p in out.iterdir() if not p.name.startswith(".")] == []
    assert any(p.name.startswith(".gen-0.rlm-export-") for p in out.iterdir())
    proc = rlm_cli(*args)
    assert proc.returncode == 0, proc.stderr
    _assert_restored(out, originals, records, json.loads(proc.stdout))
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


@pytest.mark.integration  # real `rlm` subprocesses
def test_killed_mid_commit_leaves_whole_partitions_and_overwrite_finishes(tmp_path: Path) -> None:
    """The renames of the commit are not one atomic step: killed between two, the partition
    already renamed is complete; a re-run refuses it unless --overwrite (docs/restore.md)."""
    cfg, _store, originals, records = _cli_env(tmp_path)
    out = tmp_path / "out"
    args = ("restore", "--config", cfg, "--topic", "gen", "--out", out)
    proc = rlm_cli(*args, env={"RLM_CRASH_AT": "restore_mid_commit"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["gen-0"]
    got = {p.name: p.read_bytes() for p in (out / "gen-0").iterdir() if p.suffix in SEGMENT_SUFFIXES}
    assert got == originals["gen-0"]
    assert rlm_cli(*args).returncode == 1
    proc = rlm_cli(*args, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    _assert_restored(out, originals, records, json.loads(proc.stdout))


def test_key_prefix_spread_store(tmp_path: Path) -> None:
    """With ``[remote] prefix_spread`` (docs/key-spread.md) the store's keys carry a hash prefix;
    restore reads through the same layout-applying backend as every command."""
    from rlm.storage.registry import open_backend

    opts = {"root": str(tmp_path / "store")}
    logs = tmp_path / "logs"
    logs.mkdir()
    for p, codec in enumerate(CODECS[:2]):
        write_generated(logs, "gen", p, codec, seed=p)
    settings = _settings([logs], {"backend": "local", "options": opts, "prefix_spread": 2})
    backend = open_backend("local", opts, 2)
    assert all(r.error is None for r in RemoteLogManager(settings, backend).run_once())
    raw = [i.key for i in create_backend("local", opts).list("") if "manifests/" in i.key]
    assert raw and all(keys.parse_root(k) is None for k in raw)  # every key under a hash prefix
    originals, records = _originals([logs], {"gen-0", "gen-1"}), _records([logs])
    _delete_local([logs])
    result = restore(settings, backend, "gen", tmp_path / "out").to_json()
    _assert_restored(tmp_path / "out", originals, records, result)


def test_a_missing_stored_index_is_rebuilt_the_other_kept_as_stored(tmp_path: Path) -> None:
    """A manifest without its ``timeindex`` object (an older copy, a store that lost it): the
    ``.timeindex`` is rebuilt as Kafka's recover builds it with ``log.index_interval_bytes`` (here
    not the writer's interval, so it differs from the original), while the stored ``.index`` is
    still the broker's, byte for byte."""
    from rlm.formats.segment_index import rebuild_indexes

    logs = tmp_path / "logs"
    logs.mkdir()
    write_generated(logs, "gen", 0, CODECS[0], seed=3)  # the writer indexes every 1024 bytes
    opts = {"root": str(tmp_path / "store")}
    settings = _settings([logs], {"backend": "local", "options": opts})  # rebuilds every 4096
    tier(settings)
    originals = _originals([logs], {"gen-0"})["gen-0"]
    _delete_local([logs])
    backend = create_backend("local", opts)
    key = sorted(i.key for i in backend.list("") if "/manifests/" in i.key)[1]
    doc = json.loads(backend.read(key))
    backend.delete(doc["objects"].pop("timeindex")["key"])
    backend.delete(key)
    backend.put(key, json.dumps(doc).encode())
    result = restore(settings, backend, "gen", tmp_path / "out").to_json()
    assert result["partitions"][0]["indexes_rebuilt"] == 1
    restored = tmp_path / "out" / "gen-0"
    _check_loadable(restored)
    base = doc["base_offset"]
    name = naming.segment_file_name(base, naming.INDEX)
    assert (restored / name).read_bytes() == originals[name]
    log = originals[naming.segment_file_name(base, naming.LOG)]
    time_name = naming.segment_file_name(base, naming.TIME_INDEX)
    assert (restored / time_name).read_bytes() == rebuild_indexes(base, list(iter_batches(log)), 4096)[1]
    assert (restored / time_name).read_bytes() != originals[time_name]


def test_a_remade_dir_without_partition_metadata_is_told_which_ids_the_store_holds(tmp_path: Path) -> None:
    """After a lost disk, an empty directory without ``partition.metadata`` names the name-only
    root, where an id'd topic has nothing: the error lists the ids the store holds; with the
    file in place the incarnation is restored."""
    topic_id = base64.urlsafe_b64encode(bytes(range(7, 23))).decode().rstrip("=")
    logs = tmp_path / "logs"
    with LogWriter(logs, "lost.t", 0, segment_bytes=1024, topic_id=topic_id) as w:
        for i in range(50):
            w.append([RecordSpec(1_700_000_000_000 + i, b"k", f"v-{i:04d}".encode() * 5)])
    settings = _settings([logs], {"backend": "local", "options": {"root": str(tmp_path / "s")}})
    tier(settings)
    originals, records = _originals([logs], {"lost.t-0"}), _records([logs])
    shutil.rmtree(logs)
    shutil.rmtree(logs.with_name("logs.rlm-state"))
    (logs / "lost.t-0").mkdir(parents=True)
    backend = create_backend("local", {"root": str(tmp_path / "s")})
    with pytest.raises(InvalidArgumentError, match=rf"holds the incarnation\(s\) with topic id {topic_id}"):
        restore(settings, backend, "lost.t", tmp_path / "out")
    (logs / "lost.t-0" / PARTITION_METADATA).write_bytes(format_partition_metadata(topic_id))
    result = restore(settings, backend, "lost.t", tmp_path / "out").to_json()
    _assert_restored(tmp_path / "out", originals, records, result)

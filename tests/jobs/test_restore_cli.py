"""``rlm restore`` (docs/restore.md): a re-created topic's current incarnation, a corrupt stored object,
an existing target, usage errors, killed restores, protected and spread stores, a missing stored index,
and ``rlm`` itself reading the restored dir through real subprocesses."""

from __future__ import annotations

import base64
import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from rlm.errors import InvalidArgumentError, KeyNotFoundError
from rlm.formats import naming
from rlm.formats.partition_metadata import format_partition_metadata
from rlm.formats.records import RecordSpec, iter_batches
from rlm.jobs.restore import restore
from rlm.logdir.discovery import PARTITION_METADATA
from rlm.logdir.writer import LogWriter
from rlm.storage.registry import create_backend, open_backend
from rlm.testing.configs import write_config
from rlm.testing.daemon import rlm_cli
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.store import object_keys
from tests.jobs.helpers import corrupt_one_object
from tests.jobs.restore_helpers import (
    SEGMENT_SUFFIXES,
    assert_restored,
    check_loadable,
    delete_local_logs,
    original_segments,
    records_by_partition,
    restore_settings,
    tier_generated_logs,
    tiered_partitions,
)
from tests.lookup.helpers import delete_local_segments
from tests.spark.conftest import CODECS, kafka_python_records, tier, write_generated

# --- identity, failures, targets, the CLI ---------------------------------------------------------


def test_recreated_topic_restores_the_current_incarnation(tmp_path: Path) -> None:
    ids = {
        "A": base64.urlsafe_b64encode(bytes(range(1, 17))).decode().rstrip("="),
        "B": base64.urlsafe_b64encode(bytes(range(101, 117))).decode().rstrip("="),
    }
    logs = tmp_path / "logs"
    settings = restore_settings([logs], {"backend": "local", "options": {"root": str(tmp_path / "s")}})
    backend = create_backend("local", {"root": str(tmp_path / "s")})
    for tag in ("A", "B"):
        shutil.rmtree(logs / "re.t-0", ignore_errors=True)  # the topic is deleted, then re-created
        with LogWriter(logs, "re.t", 0, segment_bytes=1024, topic_id=ids[tag]) as w:
            for i in range(60 if tag == "A" else 40):
                w.append([RecordSpec(1_700_000_000_000 + i, b"k", f"{tag}-{i:04d}".encode() * 4)])
        RemoteLogManager(settings, backend).run_once()
    assert {object_keys.parse_root(i.key).topic_id for i in backend.list("")} == set(ids.values())  # type: ignore[union-attr]
    want = kafka_python_records(logs / "re.t-0")
    delete_local_segments(logs / "re.t-0", keep_last=1)
    restore(settings, backend, "re.t", tmp_path / "out")
    restored = tmp_path / "out" / "re.t-0"
    got = kafka_python_records(restored)
    assert got and all((r[3] or b"").startswith(b"B-") for r in got) and got == want[: len(got)]
    assert (restored / PARTITION_METADATA).read_bytes() == format_partition_metadata(ids["B"])


def _cli_env(tmp_path: Path) -> tuple[Path, Path, dict[str, dict[str, bytes]], dict[str, list[Any]]]:
    settings, dirs = tier_generated_logs(
        tmp_path, {"backend": "local", "options": {"root": str(tmp_path / "store")}}
    )
    originals, records = original_segments(dirs, tiered_partitions(settings)), records_by_partition(dirs)
    delete_local_logs(dirs)
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
    assert_restored(out, originals, records, result)
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
    settings, dirs = tier_generated_logs(
        tmp_path, {"backend": "local", "options": {"root": str(tmp_path / "store")}}
    )
    originals, records = original_segments(dirs, tiered_partitions(settings)), records_by_partition(dirs)
    shutil.rmtree(dirs[0])
    shutil.rmtree(dirs[0].with_name(dirs[0].name + ".rlm-state"))
    (dirs[0] / "gen-4").mkdir(parents=True)
    backend = create_backend("local", {"root": str(tmp_path / "store")})
    result = restore(settings, backend, "gen", tmp_path / "out").to_json()
    assert_restored(tmp_path / "out", {"gen-4": originals["gen-4"]}, records, result)


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
    settings, dirs = tier_generated_logs(tmp_path, store)
    backend = create_backend("local", {"root": str(tmp_path / "store")})
    manifests = [json.loads(backend.read(i.key)) for i in backend.list("") if "/manifests/" in i.key]
    assert manifests and all(m["protection"]["compression"] == "zstd" for m in manifests)
    assert all(("encryption" in m["protection"]) == encrypt for m in manifests)
    originals, records = original_segments(dirs, tiered_partitions(settings)), records_by_partition(dirs)
    delete_local_logs(dirs)
    result = restore(settings, backend, "gen", tmp_path / "out").to_json()
    assert_restored(tmp_path / "out", originals, records, result)
    if encrypt:
        bare = restore_settings(dirs, {"backend": "local", "options": {"root": str(tmp_path / "store")}})
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
    assert_restored(out, originals, records, json.loads(proc.stdout))
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
    assert_restored(out, originals, records, json.loads(proc.stdout))


def test_key_prefix_spread_store(tmp_path: Path) -> None:
    """With ``[remote] prefix_spread`` (docs/key-spread.md) the store's keys carry a hash prefix;
    restore reads through the same layout-applying backend as every command."""

    opts = {"root": str(tmp_path / "store")}
    logs = tmp_path / "logs"
    logs.mkdir()
    for p, codec in enumerate(CODECS[:2]):
        write_generated(logs, "gen", p, codec, seed=p)
    settings = restore_settings([logs], {"backend": "local", "options": opts, "prefix_spread": 2})
    backend = open_backend("local", opts, 2)
    assert all(r.error is None for r in RemoteLogManager(settings, backend).run_once())
    raw = [i.key for i in create_backend("local", opts).list("") if "manifests/" in i.key]
    assert raw and all(object_keys.parse_root(k) is None for k in raw)  # every key under a hash prefix
    originals, records = original_segments([logs], {"gen-0", "gen-1"}), records_by_partition([logs])
    delete_local_logs([logs])
    result = restore(settings, backend, "gen", tmp_path / "out").to_json()
    assert_restored(tmp_path / "out", originals, records, result)


def test_a_missing_stored_index_is_rebuilt_the_other_kept_as_stored(tmp_path: Path) -> None:
    """A manifest without its ``timeindex`` object (an older copy, a store that lost it): the
    ``.timeindex`` is rebuilt as Kafka's recover builds it with ``log.index_interval_bytes`` (here
    not the writer's interval, so it differs from the original), while the stored ``.index`` is
    still the broker's, byte for byte."""
    from rlm.formats.indexes.segment_index import rebuild_indexes

    logs = tmp_path / "logs"
    logs.mkdir()
    write_generated(logs, "gen", 0, CODECS[0], seed=3)  # the writer indexes every 1024 bytes
    opts = {"root": str(tmp_path / "store")}
    settings = restore_settings([logs], {"backend": "local", "options": opts})  # rebuilds every 4096
    tier(settings)
    originals = original_segments([logs], {"gen-0"})["gen-0"]
    delete_local_logs([logs])
    backend = create_backend("local", opts)
    key = sorted(i.key for i in backend.list("") if "/manifests/" in i.key)[1]
    doc = json.loads(backend.read(key))
    backend.delete(doc["objects"].pop("timeindex")["key"])
    backend.delete(key)
    backend.put(key, json.dumps(doc).encode())
    result = restore(settings, backend, "gen", tmp_path / "out").to_json()
    assert result["partitions"][0]["indexes_rebuilt"] == 1
    restored = tmp_path / "out" / "gen-0"
    check_loadable(restored)
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
    settings = restore_settings([logs], {"backend": "local", "options": {"root": str(tmp_path / "s")}})
    tier(settings)
    originals, records = original_segments([logs], {"lost.t-0"}), records_by_partition([logs])
    shutil.rmtree(logs)
    shutil.rmtree(logs.with_name("logs.rlm-state"))
    (logs / "lost.t-0").mkdir(parents=True)
    backend = create_backend("local", {"root": str(tmp_path / "s")})
    with pytest.raises(InvalidArgumentError, match=rf"holds the incarnation\(s\) with topic id {topic_id}"):
        restore(settings, backend, "lost.t", tmp_path / "out")
    (logs / "lost.t-0" / PARTITION_METADATA).write_bytes(format_partition_metadata(topic_id))
    result = restore(settings, backend, "lost.t", tmp_path / "out").to_json()
    assert_restored(tmp_path / "out", originals, records, result)

"""A manifest's object names are a stored contract (docs/formats.md §6.3): the role constants of
rlm/tiering/store/manifest.py are the only keying, a manifest an earlier rlm wrote reads through them and
writes back byte for byte, and a copy stores each object under its object_keys.py file name."""

from __future__ import annotations

from pathlib import Path

from rlm.storage.local import LocalBackend
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.store import object_keys
from rlm.tiering.store.manifest import (
    ENTRIES_OBJECT,
    INDEX_OBJECT,
    LEADER_EPOCHS_OBJECT,
    LOG_OBJECT,
    TIME_INDEX_OBJECT,
    SegmentManifest,
)
from tests.lookup.helpers import settings_for, write_generated

_ATTEMPT = "gen-3/data/00000000000000000107-1a20b610738-42465d3b/"
#: Written by rlm before the object names became constants (a real store's manifest).
OLD_MANIFEST = (
    b'{"attempt_id":"1a20b610738-42465d3b","base_offset":107,"created_ms":1795487237958,'
    b'"first_timestamp":1700000014951,"format_version":1,"index_entries":8,"last_offset":204,'
    b'"leader_epochs":[[0,0]],"max_timestamp":1700000028941,"objects":{'
    b'"index":{"crc32c":309908281,"key":"' + _ATTEMPT.encode() + b'segment.index","size":96},'
    b'"leader_epoch_checkpoint":{"crc32c":1884391198,"key":"'
    + _ATTEMPT.encode()
    + b'leader-epoch-checkpoint","size":8},'
    b'"log":{"crc32c":3441485612,"key":"' + _ATTEMPT.encode() + b'segment.log","size":44406},'
    b'"segment.remotelogindex":{"crc32c":1404566435,"key":"'
    + _ATTEMPT.encode()
    + b'segment.remotelogindex","size":1195},'
    b'"timeindex":{"crc32c":3507165466,"key":"' + _ATTEMPT.encode() + b'segment.timeindex","size":144}},'
    b'"partition":3,"record_batches":14,"size_bytes":44406,"topic":"gen",'
    b'"txn_index":{"entries":0,"source":"rebuilt"}}'
)


def test_an_old_manifest_reads_through_the_role_names_and_writes_back_unchanged() -> None:
    m = SegmentManifest.from_json(OLD_MANIFEST)
    assert m.objects[ENTRIES_OBJECT].key == _ATTEMPT + object_keys.SEGMENT_ENTRIES
    assert m.log is m.objects[LOG_OBJECT] and m.log.key == _ATTEMPT + object_keys.LOG
    assert m.objects[INDEX_OBJECT].key == _ATTEMPT + object_keys.OFFSET_INDEX
    assert m.objects[TIME_INDEX_OBJECT].key == _ATTEMPT + object_keys.TIME_INDEX
    assert m.objects[LEADER_EPOCHS_OBJECT].key == _ATTEMPT + object_keys.LEADER_EPOCHS
    assert m.to_json() == OLD_MANIFEST


def test_a_copy_names_its_objects_by_role_and_stores_them_by_file_name(tmp_path: Path) -> None:
    logs, store = tmp_path / "logs", tmp_path / "store"
    write_generated(logs, "t", 0, batches=60, seed=2, segment_bytes=8_000)
    settings = settings_for([logs], options={"root": str(store)})
    manager = RemoteLogManager(settings, LocalBackend(root=str(store)))
    manager.run_once()
    manifests = sorted((store / "t-0" / "manifests").glob("*.json"))
    assert manifests
    files = {
        LOG_OBJECT: object_keys.LOG,
        INDEX_OBJECT: object_keys.OFFSET_INDEX,
        TIME_INDEX_OBJECT: object_keys.TIME_INDEX,
        LEADER_EPOCHS_OBJECT: object_keys.LEADER_EPOCHS,
        ENTRIES_OBJECT: object_keys.SEGMENT_ENTRIES,
    }
    for path in manifests:
        m = SegmentManifest.from_json(path.read_bytes())
        assert set(files) <= set(m.objects)
        for name, file in files.items():
            assert m.objects[name].key.endswith("/" + file) and (store / m.objects[name].key).is_file()

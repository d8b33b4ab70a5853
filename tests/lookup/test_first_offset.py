"""A fetch names its first record offset from the batch header when the batch's offsets have no
gaps, and decodes the records only when they may (compaction) — the answer is the same."""

from __future__ import annotations

from rlm.formats.records import Record, RecordSpec, build_batch, decode_records, iter_batches
from rlm.tiering.read.answers import first_offset_at_least


def _first_by_decoding(data: bytes, offset: int) -> int:
    batch = next(iter_batches(data))
    return next(r.offset for r in decode_records(data, batch) if r.offset >= offset)


def test_a_dense_batch_is_answered_from_its_header() -> None:
    data = build_batch([RecordSpec(1000 + i, b"k", b"v") for i in range(5)], base_offset=100)
    batch = next(iter_batches(data))
    for offset in (0, 100, 102, 104):
        assert first_offset_at_least(batch, offset) == _first_by_decoding(data, offset)


def test_a_compacted_batch_is_decoded() -> None:
    kept = [Record(o, 1000 + o, b"k", b"v") for o in (101, 103)]  # 100, 102, 104 cleaned away
    data = build_batch(kept, base_offset=100, last_offset=104)
    batch = next(iter_batches(data))
    assert batch.record_count == 2 and batch.last_offset == 104
    for offset in (100, 102):
        assert first_offset_at_least(batch, offset) is None  # the header cannot tell: decode
        assert _first_by_decoding(data, offset) == offset + 1

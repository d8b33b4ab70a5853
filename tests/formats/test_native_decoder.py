"""The compiled decoder (rlm.formats.records.native, docs/decoder.md) equals the Python reference.

Both decoders run through the public entry point, ``rlm.jobs.reading.decode.task_to_arrow``: on generated
logs (every codec, headers, null keys/values, control batches, transactions with aborts, v0/v1
messages, LogAppendTime, compacted gaps, random windows and chunk sizes), on the real broker
fixtures; corrupt input is tests/formats/test_native_decoder_corrupt.py. Equal means: the same Arrow
batches, or the same RlmError text.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlm.errors import ConfigError, NativeExtensionError, RlmError
from rlm.formats.compression import Compression, compress
from rlm.formats.records import (
    ControlRecordType,
    Header,
    Record,
    RecordSpec,
    TimestampType,
    build_batch,
    choice,
    decode_records,
    encode_control_key,
    encode_end_txn_marker,
    iter_batches,
    native,
)
from tests.formats.native_helpers import INT64_MAX, PROPERTY, T0, assert_same, needs_native, run, task
from tests.formats.test_records import legacy_message
from tests.fuzz.harness import fix_crcs, mutated

#: batches with headers (one non-ASCII key), null keys and values, a LogAppendTime one
SEED_LOG = build_batch(
    [
        RecordSpec(
            T0 + i,
            None if i == 1 else b"k%d" % i,
            None if i == 2 else b"v" * i,
            (Header("h", None), Header("é", b"x")) if i % 2 else (),
        )
        for i in range(5)
    ],
    base_offset=40,
) + build_batch(
    [RecordSpec(T0, b"k", b"v")],
    base_offset=45,
    log_append_time=T0 + 5,
    timestamp_type=TimestampType.LOG_APPEND_TIME,
)


def test_the_extension_is_built_where_required() -> None:
    # `make test` (and so CI) sets RLM_REQUIRE_NATIVE: a build that fell back to Python fails here.
    if not (os.environ.get("RLM_REQUIRE_NATIVE") or os.environ.get("CI")):
        pytest.skip("RLM_REQUIRE_NATIVE/CI unset: the Python fallback is allowed")
    assert native.extension_error() is None, (
        f"the compiled decoder did not build ({native.extension_error()}): `make install` needs a C "
        "compiler and Python's headers (python3.11-dev); see docs/decoder.md"
    )


# -- generated logs ---------------------------------------------------------------------------

utf8_keys = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)
headers = st.lists(st.builds(Header, utf8_keys, st.none() | st.binary(max_size=8)), max_size=3)
records = st.lists(
    st.builds(
        RecordSpec,
        st.integers(-5_000, 5_000).map(lambda d: T0 + d),
        st.none() | st.binary(max_size=12),
        st.none() | st.binary(max_size=40),
        headers.map(tuple),
    ),
    min_size=0,
    max_size=12,
)


@st.composite
def v2_batch(draw: st.DrawFn, base: int, pid: int) -> tuple[bytes, int]:
    specs = draw(records)
    codec = draw(st.sampled_from(Compression))
    log_append = draw(st.booleans())
    txn = draw(st.booleans())
    gaps = draw(st.booleans()) and len(specs) > 1
    recs: list[RecordSpec | Record] = list(specs)
    if gaps:  # compaction's sparse offsets
        recs = [Record(base + 3 * i, s.timestamp, s.key, s.value, s.headers) for i, s in enumerate(specs)]
    n = 3 * len(specs) if gaps else len(specs)
    ts_type = TimestampType.LOG_APPEND_TIME if log_append else TimestampType.CREATE_TIME
    raw = build_batch(
        recs,
        base_offset=base,
        compression=codec,
        timestamp_type=ts_type,
        log_append_time=T0 + 7 if log_append else None,
        producer_id=pid if txn else -1,
        producer_epoch=0 if txn else -1,
        base_sequence=0 if txn else -1,
        is_transactional=txn,
        last_offset=base if not specs else None,
        max_timestamp=T0 if not specs else None,
        snappy_xerial=draw(st.booleans()),
    )
    return raw, max(n, 1)


def control(base: int, pid: int, kind: ControlRecordType) -> bytes:
    marker = RecordSpec(T0, encode_control_key(kind), encode_end_txn_marker(0))
    return build_batch(
        [marker], base_offset=base, is_control=True, is_transactional=True, producer_id=pid, producer_epoch=0
    )


@st.composite
def legacy(draw: st.DrawFn, base: int) -> tuple[bytes, int]:
    magic = draw(st.sampled_from((0, 1)))
    n = draw(st.integers(1, 4))
    codec = draw(st.sampled_from(Compression))
    values = [draw(st.none() | st.binary(max_size=20)) for _ in range(n)]
    keys = [draw(st.none() | st.binary(max_size=6)) for _ in range(n)]
    ts_attr = 0x08 if magic == 1 and draw(st.booleans()) else 0
    if codec is Compression.NONE:
        return legacy_message(base, magic, keys[0], values[0], ts=T0 + 1, attrs=ts_attr), 1
    # v1 inner offsets are relative (0..n-1), v0 absolute; the wrapper holds the last absolute one.
    inner = b"".join(
        legacy_message(i if magic == 1 else base + i, magic, keys[i], values[i], ts=T0 + i) for i in range(n)
    )
    return legacy_message(
        base + n - 1, magic, None, compress(codec, inner), attrs=int(codec) | ts_attr, ts=T0 + 9
    ), n


@st.composite
def logs(draw: st.DrawFn) -> tuple[bytes, tuple[tuple[int, int, int], ...]]:
    """A log of v2 batches (some transactional, committed or aborted), control markers and v0/v1
    messages, and the aborted transactions a read_committed task would carry."""
    out = []
    aborted = []
    base = draw(st.integers(0, 1 << 40))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(("v2", "v2", "v2", "txn", "legacy")))
        if kind == "legacy":
            raw, n = draw(legacy(base))
            out.append(raw)
        elif kind == "txn":
            pid = draw(st.integers(1, 1000))
            raw, n = draw(v2_batch(base, pid))
            abort = draw(st.booleans())
            marker = ControlRecordType.ABORT if abort else ControlRecordType.COMMIT
            out.append(raw + control(base + n, pid, marker))
            if abort:
                aborted.append((pid, base, base + n))
            n += 1
        else:
            raw, n = draw(v2_batch(base, -1))
            out.append(raw)
        base += n
    return b"".join(out), tuple(aborted)


@needs_native
@PROPERTY
@given(logs(), st.data())
def test_generated_logs_decode_the_same(
    log: tuple[bytes, tuple[tuple[int, int, int], ...]], data: st.DataObject
) -> None:
    raw, aborted = log
    lo = data.draw(st.integers(0, 1 << 41) | st.just(0))
    hi = data.draw(st.just(INT64_MAX) | st.integers(lo, 1 << 41))
    ts_lo = data.draw(st.none() | st.integers(T0 - 6000, T0 + 6000))
    ts_hi = data.draw(st.none() | st.integers(T0 - 6000, T0 + 6000))
    committed = data.draw(st.booleans())
    t = task(lo=lo, hi=hi, ts_lo=ts_lo, ts_hi=ts_hi, aborted=aborted if committed else None)
    assert_same(t, raw, rows=data.draw(st.sampled_from((1, 3, 7, 8192))))


def decoded(decoder: native.Decoder, data: bytes) -> list[Any]:
    """``decode_records`` of every batch (the lookup / fetch / dump path), or the error it raised."""
    native.set_decoder(decoder)
    out: list[Any] = []
    try:
        for batch in iter_batches(data):
            try:
                records = decode_records(data, batch)
            except RlmError as err:
                out.append((type(err).__name__, str(err), err.position, err.offset))
                continue
            assert all(type(r) is Record and all(type(h) is Header for h in r.headers) for r in records)
            out.append(records)
    except RlmError as err:  # the scan itself (CRC, sizes): not the decoder's
        out.append(str(err))
    finally:
        native.set_decoder(None)
    return out


@needs_native
@PROPERTY
@given(logs(), mutated(SEED_LOG, max_ops=3).map(fix_crcs))
def test_decode_records_is_the_same(log: tuple[bytes, Any], corrupt: bytes) -> None:
    for data in (log[0], corrupt):
        assert decoded("native", data) == decoded("python", data)


@needs_native
def test_every_column_kind_round_trips() -> None:
    # One hand-checked case per column feature, so a failure names it plainly.
    specs = [
        RecordSpec(T0, None, None),
        RecordSpec(T0 + 1, b"k", b"", (Header("ключ-🔑", None),)),
        RecordSpec(T0 + 2, b"", b"v", (Header("", b"\x00\xff"), Header("a", b"b"))),
    ]
    raw = build_batch(specs, base_offset=10, compression=Compression.ZSTD)
    (b,) = assert_same(task(), raw)
    assert b.to_pylist() == [
        {
            "key": None,
            "value": None,
            "topic": "tópic",
            "partition": 3,
            "offset": 10,
            "timestamp": b.column("timestamp")[0].as_py(),
            "timestampType": 0,
            "headers": None,
        },
        {
            "key": b"k",
            "value": b"",
            "topic": "tópic",
            "partition": 3,
            "offset": 11,
            "timestamp": b.column("timestamp")[1].as_py(),
            "timestampType": 0,
            "headers": [{"key": "ключ-🔑", "value": None}],
        },
        {
            "key": b"",
            "value": b"v",
            "topic": "tópic",
            "partition": 3,
            "offset": 12,
            "timestamp": b.column("timestamp")[2].as_py(),
            "timestampType": 0,
            "headers": [{"key": "", "value": b"\x00\xff"}, {"key": "a", "value": b"b"}],
        },
    ]
    assert b.column("timestamp").cast(pa.int64()).to_pylist() == [(T0 + i) * 1000 for i in range(3)]


@needs_native
def test_large_pending_bytes_are_taken_early(monkeypatch: pytest.MonkeyPatch) -> None:
    # Arrow's int32 offsets: once FLUSH_BYTES of key/value/header bytes are pending, the rows so far
    # go out before the next batch — the same rows, in smaller Arrow batches.
    raw = b"".join(
        build_batch([RecordSpec(T0, b"k", b"v" * 300) for _ in range(5)], base_offset=5 * i) for i in range(6)
    )
    ref = run("python", task(), raw, 8192)
    monkeypatch.setattr(native, "FLUSH_BYTES", 1000)
    got = run("native", task(), raw, 8192)
    assert not isinstance(ref, str) and not isinstance(got, str)
    assert [b.num_rows for b in got] == [5] * 6  # 1505 bytes pending after each batch
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches(ref))


# -- real broker fixtures ----------------------------------------------------------------------


def fixture_logs(root: Path) -> Iterator[Path]:
    yield from sorted(p for p in (root / "kafka-logs").rglob("*.log") if p.stat().st_size)


@needs_native
def test_real_fixtures_decode_the_same(fixtures_dir: Path) -> None:
    rows = 0
    for path in fixture_logs(fixtures_dir):
        data = path.read_bytes()
        for t in (task(), task(lo=5, hi=1000), task(ts_lo=T0 - 10**10, ts_hi=T0), task(aborted=())):
            got = assert_same(t, data, rows=1000)
            rows += 0 if isinstance(got, str) else sum(b.num_rows for b in got)
    assert rows > 10_000  # the fixtures hold real data, decoded


def test_overflowing_timestamp_is_an_rlm_error_in_both() -> None:
    raw = build_batch([RecordSpec(INT64_MAX // 100, b"k", b"v")], base_offset=0)
    for decoder in ("python", "native") if native.extension_error() is None else ("python",):
        got = run(decoder, task(), raw, 10)  # type: ignore[arg-type]
        assert isinstance(got, str) and "does not fit int64 microseconds" in got


# -- choice of decoder -------------------------------------------------------------------------


def test_the_choice_is_logged_once(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    monkeypatch.setenv("RLM_DECODER", "python")
    native.set_decoder(None)
    with caplog.at_level(logging.INFO, logger="rlm.decoder"):
        assert native.active_decoder() == "python"
        assert native.active_decoder() == "python"
    native.set_decoder(None)
    lines = [r.getMessage() for r in caplog.records if r.name == "rlm.decoder"]
    assert lines == ["record decoder: python (RLM_DECODER=python; docs/decoder.md)"]


def test_forcing_a_missing_extension_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice, "_columns", None)
    monkeypatch.setattr(choice, "_IMPORT_ERROR", "No module named 'rlm.formats.records._columns'")
    with pytest.raises(NativeExtensionError, match="RLM_DECODER=native but the compiled decoder does not"):
        native.set_decoder("native")
    monkeypatch.setenv("RLM_DECODER", "auto")
    native.set_decoder(None)
    assert native.active_decoder() == "python"  # auto falls back, with its log line
    native.set_decoder(None)
    with pytest.raises(ConfigError, match="use native, python or auto"):
        native.set_decoder("rust")  # type: ignore[arg-type]

"""What the native-decoder test modules share (tests/formats/test_native_decoder*.py): a ReadTask
over one local segment, running one decoder through ``rlm.jobs.reading.decode.task_to_arrow``, and the
comparison of both decoders (the same Arrow batches, or the same one-line RlmError text)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings

from rlm.errors import RlmError
from rlm.formats.records import native
from rlm.jobs.reading.decode import task_to_arrow
from rlm.jobs.reading.plan import ReadTask

T0 = 1_700_000_000_000
INT64_MAX = (1 << 63) - 1
PROPERTY = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)

needs_native = pytest.mark.skipif(
    native.extension_error() is not None, reason=f"compiled decoder not built: {native.extension_error()}"
)


def task(
    *,
    lo: int = 0,
    hi: int = INT64_MAX,
    ts_lo: int | None = None,
    ts_hi: int | None = None,
    aborted: tuple[tuple[int, int, int], ...] | None = None,
) -> ReadTask:
    return ReadTask(
        "tópic",
        3,
        "local",
        "/logs/t-3/00000000000000000000.log",
        0,
        0,
        lo,
        hi,
        ts_lo,
        ts_hi,
        base_offset=0,
        isolation="read_uncommitted" if aborted is None else "read_committed",
        aborted=aborted or (),
    )


def run(decoder: native.Decoder, t: ReadTask, data: bytes, rows: int) -> list[pa.RecordBatch] | str:
    native.set_decoder(decoder)
    try:
        out = list(task_to_arrow(t, data, rows_per_batch=rows))
    except RlmError as err:
        assert "\n" not in str(err)
        return f"{type(err).__name__}: {err}"
    finally:
        native.set_decoder(None)
    for b in out:
        b.validate(full=True)
    return out


def assert_same(t: ReadTask, data: bytes, rows: int = 8192) -> list[pa.RecordBatch] | str:
    ref = run("python", t, data, rows)
    got = run("native", t, data, rows)
    if isinstance(ref, str) or isinstance(got, str):
        assert got == ref
        return ref
    assert [b.num_rows for b in got] == [b.num_rows for b in ref]
    for a, b in zip(ref, got, strict=True):
        assert b.equals(a), (a.to_pylist(), b.to_pylist())
    return got

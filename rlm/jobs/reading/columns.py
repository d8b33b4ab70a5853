"""Arrow record batches from the compiled decoder's buffers (rlm.formats.records.native, docs/decoder.md).

Wraps the buffers with ``pyarrow.Array.from_buffers`` (no copy, no Python object per record);
pyarrow is imported lazily, as everywhere in rlm.jobs.
"""

from __future__ import annotations

from typing import Any

from rlm.formats.records.native import Columns

__all__ = ["to_record_batch"]


def to_record_batch(cols: Columns, topic: str, partition: int, schema: Any) -> Any:
    """One ``pa.RecordBatch`` of ``schema`` (rlm.jobs.reading.decode.arrow_schema) holding ``cols``."""
    import pyarrow as pa

    n = cols.rows
    buf = pa.py_buffer

    def opt(b: bytes | None) -> Any:
        return None if b is None else buf(b)

    def binary(typ: Any, count: int, validity: bytes | None, offsets: bytes, data: bytes) -> Any:
        return pa.Array.from_buffers(typ, count, [opt(validity), buf(offsets), buf(data)])

    headers_type = schema.field("headers").type
    entry = headers_type.value_type
    struct = pa.StructArray.from_arrays(
        [
            binary(pa.string(), cols.n_headers, None, cols.hkey_offsets, cols.hkey_data),
            binary(pa.binary(), cols.n_headers, cols.hval_validity, cols.hval_offsets, cols.hval_data),
        ],
        fields=[entry.field(0), entry.field(1)],
    )
    arrays = [
        binary(pa.binary(), n, cols.key_validity, cols.key_offsets, cols.key_data),
        binary(pa.binary(), n, cols.value_validity, cols.value_offsets, cols.value_data),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.Array.from_buffers(pa.int64(), n, [None, buf(cols.offsets)]),
        pa.Array.from_buffers(schema.field("timestamp").type, n, [None, buf(cols.stamps)]),
        pa.Array.from_buffers(pa.int32(), n, [None, buf(cols.types)]),
        pa.Array.from_buffers(
            headers_type, n, [opt(cols.headers_validity), buf(cols.headers_offsets)], children=[struct]
        ),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)

"""Reading an export directory back with pyarrow (both engines write Spark's layout)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

#: Spark's file names: part-<task>-<job uuid>.c000.<codec>.parquet
PART_FILE = re.compile(r"part-\d{5}-[0-9a-f-]{36}\.c000\.snappy\.parquet")


def read_export(out: Path) -> Any:
    """Every file under ``out/topic=T/partition=P/``, with ``topic``/``partition`` from the names."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for path in sorted(out.glob("topic=*/partition=*/*.parquet")):
        table = pq.read_table(path)
        n = table.num_rows
        topic = path.parent.parent.name.removeprefix("topic=")
        partition = int(path.parent.name.removeprefix("partition="))
        tables.append(
            table.append_column("topic", pa.array([topic] * n, pa.string())).append_column(
                "partition", pa.array([partition] * n, pa.int32())
            )
        )
    return pa.concat_tables(tables) if tables else None


def sorted_rows(out: Path) -> list[tuple[Any, ...]]:
    """Every exported row as a tuple (all eight columns), sorted."""
    table = read_export(out)
    return [] if table is None else table_rows(table)


def table_rows(table: Any) -> list[tuple[Any, ...]]:
    """An Arrow table of the export's columns (any order) as :func:`sorted_rows` gives them."""
    cols = ["topic", "partition", "offset", "timestamp", "timestampType", "key", "value", "headers"]
    data = [table.column(c).to_pylist() for c in cols]
    rows = []
    for row in zip(*data, strict=True):
        headers = tuple((h["key"], h["value"]) for h in row[-1]) if row[-1] is not None else None
        rows.append((*row[:-1], headers))
    return sorted(rows, key=lambda r: (r[0], r[1], r[2]))


def layout(out: Path) -> dict[str, int]:
    """``{partition dir: number of part files}`` plus the root's other entries (``_SUCCESS``);
    hidden files (Hadoop's ``.crc``) left out. Asserts every data file has Spark's name form."""
    found: dict[str, int] = {}
    for path in out.rglob("*"):
        if path.name.startswith(".") or path.is_dir():
            continue
        rel = path.relative_to(out)
        if rel.suffix == ".parquet":
            assert PART_FILE.fullmatch(path.name), path.name
            found[str(rel.parent)] = found.get(str(rel.parent), 0) + 1
        else:
            found[str(rel)] = 0
    return found


def corrupt_one_object(store: Path) -> Path:
    """Flip a byte in the middle of the first tiered ``.log`` object under ``store`` (its batch
    CRC then fails); returns the object's path."""
    victim = sorted(p for p in store.rglob("*") if p.is_file() and p.name.endswith(".log"))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    return victim

"""The tables room: tiered history as tables — Spark's DataFrame and Parquet export (`dataframe`,
`spark_sink`), the same export in one process without Spark (`export_local`), the sinks both
engines write through (`sink`), and the incremental Apache Iceberg table (`iceberg`,
`iceberg_files`, `iceberg_read`) (docs/export.md, docs/iceberg.md). Imports the reading room.

This module is the room's public face: code outside the room imports from here, never from its
modules (tests/ops/test_rooms.py).
"""

from __future__ import annotations

from rlm.jobs.tables.dataframe import export, read_tiered
from rlm.jobs.tables.export_local import export_local
from rlm.jobs.tables.iceberg import IcebergTarget, export_iceberg, local_engine, spark_engine
from rlm.jobs.tables.sink import ExportResult

__all__ = [
    "ExportResult",
    "IcebergTarget",
    "export",
    "export_iceberg",
    "export_local",
    "local_engine",
    "read_tiered",
    "spark_engine",
]

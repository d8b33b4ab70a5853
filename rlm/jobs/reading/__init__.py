"""The reading room: how every job reads the two tiers — the driver's plan of read tasks (`plan`:
the tier split and each partition's visible window, docs/visibility.md), the byte ranges a task
reads (`byte_ranges`), the executor's decoding of a task into rows or Arrow batches (`decode`,
`columns`), and the check that an executor runs the driver's build (`ship`, docs/spark-cluster.md).
Imports no other room of rlm.jobs.

This module is the room's public face: code outside the room imports from here, never from its
modules (tests/ops/test_rooms.py).
"""

from __future__ import annotations

from rlm.jobs.reading import decode
from rlm.jobs.reading.byte_ranges import pack_entries
from rlm.jobs.reading.decode import (
    KAFKA_SCHEMA_DDL,
    ROWS_PER_BATCH,
    Row,
    arrow_schema,
    iter_task_records,
    read_task_bytes,
    task_to_arrow,
)
from rlm.jobs.reading.plan import (
    DEFAULT_TARGET_BYTES,
    MAX_OFFSET,
    BackendSpec,
    PartitionPlan,
    ReadPlan,
    ReadTask,
    check_time_range,
    plan_partition,
    plan_read,
    select_partitions,
)
from rlm.jobs.reading.ship import check_build, rlm_build

__all__ = [
    "DEFAULT_TARGET_BYTES",
    "KAFKA_SCHEMA_DDL",
    "MAX_OFFSET",
    "ROWS_PER_BATCH",
    "BackendSpec",
    "PartitionPlan",
    "ReadPlan",
    "ReadTask",
    "Row",
    "arrow_schema",
    "check_build",
    "check_time_range",
    "decode",
    "iter_task_records",
    "pack_entries",
    "plan_partition",
    "plan_read",
    "read_task_bytes",
    "rlm_build",
    "select_partitions",
    "task_to_arrow",
]

"""The read room: what a consumer may see and where its records are — visibility
(`visibility`), lookups on both tiers (`lookup`, `lookup_local`, `lookup_remote`, `answers`,
`remote_sets`, `served_sets`), remote fetches with read-ahead and cache (`remote_fetch`,
`readahead`, `cache`), transactions and isolation (`isolation`, `partition_txns`, `txn_sources`)
and the readers every surface shares (`readers`) (docs/read-path.md, docs/visibility.md).
Imports every room below the engine.

This module is the room's public face: packages outside the room import from here, never from
its modules (tests/ops/test_rooms.py).
"""

from __future__ import annotations

from rlm.tiering.read.answers import FetchResult
from rlm.tiering.read.cache import RemoteRangeCache
from rlm.tiering.read.isolation import Isolation, check_isolation
from rlm.tiering.read.lookup import PartitionReader
from rlm.tiering.read.partition_txns import PartitionTxns
from rlm.tiering.read.readers import TieredReaders, check_partition_number, check_topic_name
from rlm.tiering.read.txn_sources import plan_sources
from rlm.tiering.read.visibility import (
    EARLIEST,
    EARLIEST_LOCAL,
    LATEST,
    LATEST_TIERED,
    MAX_TIMESTAMP,
    SPECIAL_TIMESTAMPS,
    PartitionOffsets,
    TieredExtent,
    Visibility,
    batches_below,
    chain_visibility,
    note_delete_records,
    partition_offsets,
    told_high_watermark,
)

__all__ = [
    "EARLIEST",
    "EARLIEST_LOCAL",
    "LATEST",
    "LATEST_TIERED",
    "MAX_TIMESTAMP",
    "SPECIAL_TIMESTAMPS",
    "FetchResult",
    "Isolation",
    "PartitionOffsets",
    "PartitionReader",
    "PartitionTxns",
    "RemoteRangeCache",
    "TieredExtent",
    "TieredReaders",
    "Visibility",
    "batches_below",
    "chain_visibility",
    "check_isolation",
    "check_partition_number",
    "check_topic_name",
    "note_delete_records",
    "partition_offsets",
    "plan_sources",
    "told_high_watermark",
]

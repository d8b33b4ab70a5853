"""The daemon's parts wired together once: the manager's store and metrics registry shared by the
readers (range cache, read-ahead), the history sampler and the HTTP app. ``rlm run`` serves what
:func:`build_api` returns; tests and benches that need the daemon's surface build it the same way."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from rlm.config import Settings
from rlm.http.app import create_app
from rlm.kafka.metrics import KafkaMetrics
from rlm.tiering.delete_records import DeletedRecords, delete_records
from rlm.tiering.local import TieringHistory
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read import RemoteRangeCache, TieredReaders

__all__ = ["DaemonApi", "build_api"]


@dataclass(frozen=True, slots=True)
class DaemonApi:
    app: FastAPI
    readers: TieredReaders
    history: TieringHistory  # not started: the caller starts and stops its sampler
    registry: CollectorRegistry
    kafka_metrics: KafkaMetrics  # the Kafka listener's, registered even when it is off
    delete_records: Callable[[str, int, int], DeletedRecords]  # rlm's DeleteRecords over the manager


def build_api(
    settings: Settings, manager: RemoteLogManager, *, history_interval_s: float = 10.0
) -> DaemonApi:
    """The HTTP app over ``manager``: status from memory and persisted state (never the store),
    lookups and fetches through readers sharing the manager's store, policy resolver and registry;
    the status page's history sampled every ``history_interval_s`` once started."""
    registry = manager.shared.metrics.registry
    readers = TieredReaders(
        settings,
        manager.shared.backend,
        progress=manager.live_progress,
        cache=RemoteRangeCache(settings.tiering.remote_cache_bytes, registry=registry),
        policies=manager.policies,
        protection=manager.shared.protection,
        checkpoints=manager.checkpoints,
        high_watermarks=manager.shared.high_watermarks,
    )
    deleter = functools.partial(delete_records, manager)
    history = TieringHistory(manager.shared.metrics, interval_s=history_interval_s)  # the page's chart
    app = create_app(
        readers,
        settings.server,
        status=lambda: manager.status(observe=False),
        registry=registry,
        history=history.snapshot,
        store=manager.store_status,
        pins=manager.shared.pins.summary,
        deleted=manager.deleted.status,
        delete_records=deleter,
    )
    return DaemonApi(app, readers, history, registry, KafkaMetrics(registry), deleter)

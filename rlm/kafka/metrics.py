"""The Kafka listener's Prometheus metrics, on the daemon's registry (docs/kafka-listener.md §8).

Registered by ``rlm run`` whether or not the listener is on (zero when it is off), so the dashboard
(configs/grafana-dashboard.json) always finds them. Imports only prometheus_client: the listener's
protocol library is not needed to export zeros.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["KafkaMetrics"]


class KafkaMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.requests = Counter(
            "rlm_kafka_requests",
            "Requests answered by the Kafka listener, by API (Kafka: kafka.network RequestsPerSec)",
            ["api"],
            registry=registry,
        )
        self.partition_errors = Counter(
            "rlm_kafka_partition_errors",
            "Fetch/ListOffsets partitions answered with a Kafka error code, by API and code name",
            ["api", "error"],
            registry=registry,
        )
        self.fetch_bytes = Counter(
            "rlm_kafka_fetch_bytes",
            "Record batch bytes sent in Fetch responses (Kafka: BytesOutPerSec)",
            registry=registry,
        )
        self.connections = Gauge(
            "rlm_kafka_connections_active", "Kafka listener connections open now", registry=registry
        )
        self.fetch_sessions = Gauge(
            "rlm_kafka_fetch_sessions",
            "Incremental fetch sessions cached (Kafka: NumIncrementalFetchSessions)",
            registry=registry,
        )
        self.fetch_session_partitions = Gauge(
            "rlm_kafka_fetch_session_partitions",
            "Partitions cached over all fetch sessions (Kafka: NumIncrementalFetchPartitionsCached)",
            registry=registry,
        )
        self.fetch_sessions_opened = Counter(
            "rlm_kafka_fetch_sessions_opened",
            "Incremental fetch sessions opened by a full Fetch (docs/kafka-listener.md §5.2)",
            registry=registry,
        )
        self.fetch_on_loop = Counter(
            "rlm_kafka_fetch_on_loop",
            "Fetches tried on the listener's event loop, by outcome: answered there (the read "
            "needed nothing that waits), handed (a pool thread went on with the read)",
            ["outcome"],
            registry=registry,
        )
        self.list_offsets_on_loop = Counter(
            "rlm_kafka_list_offsets_on_loop",
            "ListOffsets tried on the listener's event loop, by outcome: answered there (no "
            "partition needed a step that waits), handed (a pool thread answered it whole)",
            ["outcome"],
            registry=registry,
        )
        self.closed = Counter(
            "rlm_kafka_connections_closed",
            "Kafka listener connections closed by the "
            "listener, by reason: protocol (bad frame, API or version), idle (silent, "
            "half-open or not reading), auth (SASL), error (a handler failed), limit (over "
            "kafka.max_connections)",
            ["reason"],
            registry=registry,
        )

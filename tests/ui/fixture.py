"""A tiered log dir served over a real socket: partitions written with LogWriter, tiered with
RemoteLogManager.run_once, the FastAPI app on uvicorn (ApiServer, port 0)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlm.cli.wiring import build_api
from rlm.config import LogSettings, RemoteSettings, ServerSettings, Settings, TieringSettings
from rlm.config.brokers import ClusterSettings
from rlm.formats.records import RecordSpec
from rlm.http.server import ApiServer
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.tiering.local.history import TieringHistory
from rlm.tiering.manager import RemoteLogManager

TOKEN = "page-test-token"
T0 = 1_735_689_600_000


def fill(writer: LogWriter, segments: int, *, records_per_batch: int = 20, value_bytes: int = 200) -> None:
    """Append until ``segments`` more segments have rolled (the active one stays empty)."""
    target = len(writer.segment_base_offsets) + segments
    n = writer.log_end_offset
    while len(writer.segment_base_offsets) < target:
        writer.append(
            [
                RecordSpec(
                    timestamp=T0 + (n + i) * 1000,
                    key=f"k{n + i}".encode(),
                    value=bytes([(n + i) % 251]) * value_bytes,
                    headers=(),
                )
                for i in range(records_per_batch)
            ]
        )
        n += records_per_batch
    writer.roll()  # the last full segment rolls too; everything below the log end is on disk


@dataclass
class Served:
    logs: Path
    settings: Settings
    manager: RemoteLogManager
    history: TieringHistory
    server: ApiServer
    writers: dict[str, LogWriter] = field(default_factory=dict)

    def status(self, topic: str, partition: int) -> dict[str, Any]:
        rows = [r for r in self.manager.status() if (r["topic"], r["partition"]) == (topic, partition)]
        assert len(rows) == 1, rows
        return rows[0]

    def tier(self) -> None:
        self.manager.run_once()
        self.history.sample()

    def close(self) -> None:
        self.server.stop()
        for w in self.writers.values():
            w.close()


def serve(tmp: Path, *, token: str = TOKEN, cluster: ClusterSettings | None = None, **tiering: Any) -> Served:
    """The daemon's API over a fresh log dir and local store; ``tiering``: more ``[tiering]`` keys."""
    logs, store = tmp / "kafka-logs", tmp / "tiered"
    logs.mkdir(exist_ok=True)  # a test may lay a metadata log down first
    settings = Settings(
        log=LogSettings(dirs=(logs,), eligibility="high-watermark"),
        remote=RemoteSettings("local", {"root": str(store)}),
        tiering=TieringSettings(gc_grace_ms=0, index_entry_bytes=4096, **tiering),
        server=ServerSettings(host="127.0.0.1", port=0, token=token),
        cluster=cluster or ClusterSettings(),
        source="<ui test>",
    )
    backend = LocalBackend(root=str(store))
    manager = RemoteLogManager(settings, backend)
    parts = build_api(settings, manager, history_interval_s=1)  # as `rlm run`; tier() samples history
    server = ApiServer(parts.app, "127.0.0.1", 0).start()
    return Served(logs, settings, manager, parts.history, server)


def writer(served: Served, topic: str, partition: int, **kw: Any) -> LogWriter:
    w = LogWriter(
        served.logs,
        topic,
        partition,
        segment_bytes=kw.pop("segment_bytes", 16 * 1024),
        index_interval_bytes=1024,
        **kw,
    )
    served.writers[f"{topic}-{partition}"] = w
    return w

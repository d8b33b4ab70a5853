"""read_tiered / export on real PySpark serve only visible offsets (docs/visibility.md): nothing at or
above the high watermark (also when those records exist only in the remote tier), nothing below a
DeleteRecords point (also once the broker's checkpoint forgot it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlm.jobs import export, plan_read, read_tiered
from tests.lookup.edges import build_edge_logs
from tests.spark.conftest import arrow_records


def _expected(visible: Any) -> dict[tuple[str, int], list[tuple[int, int, bytes | None, bytes | None]]]:
    out = {}
    for name, vis in visible.items():
        topic, _, p = name.rpartition("-")
        out[(topic, int(p))] = [(r.offset, r.timestamp, r.key, r.value) for r in vis.records]
    return out


def _plain(got: dict[tuple[str, int], list[Any]]) -> dict[tuple[str, int], list[Any]]:
    return {tp: [r[:4] for r in recs] for tp, recs in got.items()}


def test_read_tiered_and_export_serve_only_visible_offsets(spark: Any, tmp_path: Path) -> None:
    edges = build_edge_logs(tmp_path / "edges")
    want = _expected(edges.visible)
    plan = plan_read(edges.settings, None, target_bytes=4_000)
    by_name = {f"{p.topic}-{p.partition}": p for p in plan.partitions}
    assert by_name["vis-0"].local_max_offset == edges.visible["vis-0"].end - 1
    assert all(t.min_offset >= edges.point for t in by_name["del-0"].tasks)
    got = arrow_records(read_tiered(spark, edges.settings, None, target_bytes=4_000).toArrow())
    assert _plain(got) == want
    assert all(recs for recs in want.values())

    out = tmp_path / "out"
    result = export(spark, edges.settings, ["vis", "del"], str(out), target_bytes=4_000)
    exported: dict[tuple[str, int], list[Any]] = {}
    for topic, partition in want:
        table = pq.read_table(out / f"topic={topic}" / f"partition={partition}")
        n = table.num_rows
        table = table.append_column("topic", pa.array([topic] * n)).append_column(
            "partition", pa.array([partition] * n, pa.int32())
        )
        exported.update(arrow_records(table))
    assert _plain(exported) == want
    assert result.records == sum(len(v) for v in want.values())

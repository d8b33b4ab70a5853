"""Spark jobs over both tiers (docs/export.md): ``read_tiered``/``export``, ``verify``, ``rebuild_index``,
bulk ``offsets_for_times``; ``export_local``, the same export without Spark (docs/export.md).

``import rlm.jobs`` is cheap: pyspark is imported only when a job runs (and only in this package).
Everything shipped to executors pickles: tasks are frozen dataclasses, the store travels as a
:class:`~rlm.jobs.reading.plan.BackendSpec` (backend name + options) and is rebuilt once per worker, which
first checks it runs the driver's rlm build (:mod:`rlm.jobs.reading.ship`; docs/spark-cluster.md).
"""

from __future__ import annotations

from rlm.jobs.checks import VerifyReport, verify
from rlm.jobs.index import offsets_for_times, rebuild_index
from rlm.jobs.reading import BackendSpec, ReadPlan, ReadTask, plan_read
from rlm.jobs.session import spark_session
from rlm.jobs.tables import ExportResult, export, export_local, read_tiered

__all__ = [
    "BackendSpec",
    "ExportResult",
    "ReadPlan",
    "ReadTask",
    "VerifyReport",
    "export",
    "export_local",
    "offsets_for_times",
    "plan_read",
    "read_tiered",
    "rebuild_index",
    "spark_session",
    "verify",
]

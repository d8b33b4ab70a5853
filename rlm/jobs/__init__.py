"""Spark jobs over both tiers (docs/export.md): ``read_tiered``/``export``, ``verify``, ``rebuild_index``,
bulk ``offsets_for_times``; ``export_local``, the same export without Spark (docs/export.md).

``import rlm.jobs`` is cheap: pyspark is imported only when a job runs (and only in this package).
Everything shipped to executors pickles: tasks are frozen dataclasses, the store travels as a
:class:`~rlm.jobs.plan.BackendSpec` (backend name + options) and is rebuilt once per worker, which
first checks it runs the driver's rlm build (:mod:`rlm.jobs.ship`; docs/spark-cluster.md).
"""

from __future__ import annotations

from rlm.jobs.export_local import export_local
from rlm.jobs.index import offsets_for_times, rebuild_index
from rlm.jobs.plan import BackendSpec, ReadPlan, ReadTask, plan_read
from rlm.jobs.read import ExportResult, export, read_tiered
from rlm.jobs.session import spark_session
from rlm.jobs.verify import VerifyReport, verify

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

"""Starting Spark for rlm's jobs: quiet when piped, console progress on a terminal."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["DEFAULT_MASTER", "spark_session"]

DEFAULT_MASTER = "local[*]"


def spark_session(
    master: str = DEFAULT_MASTER,
    app_name: str = "rlm",
    *,
    progress: bool | None = None,
    conf: dict[str, str] | None = None,
) -> Any:
    """Get or create a SparkSession on ``master`` (log level WARN).

    ``progress`` (default: stderr is a terminal) turns Spark's console progress bar on/off.
    Python workers run the driver's interpreter (``PYSPARK_PYTHON`` defaults to it), so a
    ``local[*]`` job uses the venv rlm is installed in; on a cluster, rlm must be installed on the
    executors (``pip install rlm[spark]`` plus the storage plugin the config names).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    show = sys.stderr.isatty() if progress is None else progress
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.showConsoleProgress", "true" if show else "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark

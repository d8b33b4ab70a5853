"""Spark with Apache Iceberg's own Spark runtime, for tests: a local Spark driver JVM that reads and
maintains the tables ``rlm export --format iceberg`` writes, as a user's Spark does.

The runtime is the pinned jar set ``make iceberg-spark`` copies from Maven Central into
``<repo>/.cache/iceberg-spark-<iceberg version>/libs`` (``tools/iceberg-spark/pom.xml``: Spark
:data:`SPARK_VERSION`, ``iceberg-spark-runtime-4.1_2.13`` :data:`ICEBERG_VERSION`, sqlite-jdbc);
``$RLM_ICEBERG_SPARK_LIBS`` names another folder. It is Spark 4.1 in its own JVM, not the pyspark
rlm installs: no Iceberg release loads in Spark 4.3 (the pom says why). Nothing is downloaded here:
a missing runtime is one line saying what to run (:func:`iceberg_spark_problem`).

``tools/iceberg-spark/IcebergSparkSql.java`` runs as a single-file source program on those jars.
It prints ``ready`` once the session is up, then takes one command per line on stdin
(:meth:`IcebergSpark.new_session`, :meth:`~IcebergSpark.sql`, :meth:`~IcebergSpark.to_parquet`)
and answers ``ok`` or ``error``. Spark's own log goes to ``<home>/spark.log``, never to that
channel.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlm.testing.line_jvm import LineJvm

__all__ = ["ICEBERG_VERSION", "SPARK_VERSION", "IcebergSpark", "iceberg_spark_libs", "iceberg_spark_problem"]

#: The pinned Iceberg and Spark versions (tools/iceberg-spark/pom.xml).
ICEBERG_VERSION = "1.12.0"
SPARK_VERSION = "4.1.1"

_REPO = Path(__file__).resolve().parents[2]
_LAUNCHER = _REPO / "tools" / "iceberg-spark" / "IcebergSparkSql.java"

#: What Spark's launcher (spark-submit) gives its JVMs on Java 17 (org.apache.spark.launcher
#: JavaModuleOptions): without ``java.nio`` open, Iceberg's vectorized Parquet reader fails.
_JAVA_OPTIONS = [
    "-XX:+IgnoreUnrecognizedVMOptions",
    "--add-modules=jdk.incubator.vector",
    *(
        f"--add-opens=java.base/{p}=ALL-UNNAMED"
        for p in (
            "java.lang",
            "java.lang.invoke",
            "java.lang.reflect",
            "java.io",
            "java.net",
            "java.nio",
            "java.util",
            "java.util.concurrent",
            "java.util.concurrent.atomic",
            "jdk.internal.ref",
            "sun.nio.ch",
            "sun.nio.cs",
            "sun.security.action",
            "sun.util.calendar",
        )
    ),
    "-Djdk.reflect.useDirectMethodHandle=false",
    "-Dio.netty.tryReflectionSetAccessible=true",
]

_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d %p %c: %m%n
"""


def _libs_dir() -> Path:
    env = os.environ.get("RLM_ICEBERG_SPARK_LIBS")
    return Path(env) if env else _REPO / ".cache" / f"iceberg-spark-{ICEBERG_VERSION}" / "libs"


def iceberg_spark_problem() -> str | None:
    """Why Spark with the Iceberg runtime cannot run here (one line naming what to install), or None."""
    libs = _libs_dir()
    if shutil.which("java") is None:
        return "no java on PATH: Spark with the Iceberg runtime needs Java 17 or later"
    if not (libs / ".complete").is_file() and not any(libs.glob("iceberg-spark-runtime-*.jar")):
        return f"no Iceberg Spark runtime in {libs}: run `make iceberg-spark` (Maven fetches it once)"
    return None


def iceberg_spark_libs() -> Path:
    """The folder of the runtime's jars; RuntimeError with :func:`iceberg_spark_problem`'s line
    when it cannot run."""
    problem = iceberg_spark_problem()
    if problem is not None:
        raise RuntimeError(problem)
    return _libs_dir()


@dataclass
class IcebergSpark:
    """A ``local[2]`` Spark driver under ``home`` with the Iceberg runtime on its classpath;
    ``conf``: Spark configuration fixed at start (``spark.sql.extensions``, catalogs, …). Use as a
    context manager or call :meth:`start` / :meth:`close`; :meth:`close` kills whatever still runs."""

    home: Path
    conf: Mapping[str, str] = field(default_factory=dict)
    heap: str = "768m"
    _jvm: LineJvm = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._jvm = LineJvm("Spark", self.log)

    @property
    def log(self) -> Path:
        return self.home / "spark.log"

    def start(self, timeout: float = 180.0) -> IcebergSpark:
        """Start the JVM and wait for ``ready`` (RuntimeError naming the log when it exits or
        does not get there within ``timeout`` seconds)."""
        libs = iceberg_spark_libs()
        self.home.mkdir(parents=True, exist_ok=True)
        log4j = self.home / "log4j2.properties"
        log4j.write_text(_LOG4J2.format(log=self.log))
        conf = {
            "spark.master": "local[2]",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC",
            "spark.local.dir": str(self.home / "tmp"),
            # What to_parquet writes: int64 microseconds, as Iceberg stores timestamps.
            "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
            **self.conf,
        }
        cmd = [
            "java",
            f"-Xmx{self.heap}",
            *_JAVA_OPTIONS,
            f"-Dlog4j2.configurationFile={log4j}",
            *(f"-D{k}={v}" for k, v in conf.items()),
            "-cp",
            f"{libs}/*",
            str(_LAUNCHER),
        ]
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
        self._jvm.start(cmd, self.home / "spark.stderr", env)
        self._jvm.answer("ready ", timeout)
        return self

    def command(self, line: str, timeout: float = 300.0) -> str:
        """Send one launcher command; what follows its ``ok`` (RuntimeError on ``error``)."""
        return self._jvm.command(line, "ok ", timeout)

    def new_session(self, conf: Mapping[str, str] | None = None) -> None:
        """Continue in a new session (its own SQL conf and catalog instances) with ``conf`` set:
        e.g. a catalog on another ``catalog.db`` under a name a previous session already used.
        Keys the JVM started with, with the same value, are skipped: static ones such as
        ``spark.sql.extensions`` cannot be set again."""
        self.command("session")
        for key, value in (conf or {}).items():
            if self.conf.get(key) != value:
                self.command(f"set {key}={value}")

    def sql(self, statement: str) -> list[dict[str, Any]]:
        """Run ``statement``; its rows as JSON objects (for small results: CALL, DESCRIBE, …)."""
        rows = json.loads(self.command(f"sql {statement}"))
        assert isinstance(rows, list)
        return rows

    def to_parquet(self, statement: str, out: Path) -> int:
        """Run ``statement`` and write its rows to the Parquet directory ``out`` (must not
        exist, no spaces in it); how many rows."""
        if " " in str(out):
            raise ValueError(f"a path without spaces, not {out}")
        return int(self.command(f"parquet {out} {statement}"))

    def close(self, timeout: float = 60.0) -> None:
        """Stop Spark cleanly (``stop``), else SIGKILL the JVM by pid."""
        self._jvm.close(timeout)

    def __enter__(self) -> IcebergSpark:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

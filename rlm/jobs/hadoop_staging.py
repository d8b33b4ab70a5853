"""An export to a Hadoop filesystem (``hdfs://``, ``s3a://``…) built aside and renamed into place:
:class:`HadoopStagedDir`, the twin of :class:`rlm.jobs.staging.StagedDir` for outputs only Spark's
JVM can reach (docs/export.md, "HDFS and S3 outputs").

Spark's own commit writes into ``out`` itself: a failed job left ``out`` behind (empty on HDFS,
``_temporary`` markers on S3A), which refused the next export, and ``--overwrite`` deleted the
previous export before the job had read a byte. Here the job writes a hidden sibling,
``.<name>.rlm-export-<random>``, and only a job that succeeded is renamed to ``out``; an old ``out``
(with ``--overwrite``) is renamed aside first and deleted last, so at every moment a complete
export is at ``out`` or, between the two renames, aside under ``.<name>.rlm-replaced-<random>``.

A rename is one NameNode operation on HDFS and a copy of every object on S3A (correct, not
atomic, and paid once more for an old ``out`` aside). A killed driver leaves its hidden staging
dir: there is no lock to tell a live export's from a dead one's on these filesystems, so nothing
removes it; delete ``.<name>.rlm-export-*`` siblings by hand once no export to ``out`` runs.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from rlm.errors import ExportOutputExistsError, StorageError

__all__ = ["HadoopStagedDir"]


@dataclass(frozen=True)
class HadoopStagedDir:
    """``out`` on the Hadoop filesystem of its scheme, staged beside it (JVM ``Path`` objects of
    the Spark session that writes it, through py4j)."""

    fs: Any  # org.apache.hadoop.fs.FileSystem
    out: Any  # org.apache.hadoop.fs.Path
    staging: Any
    aside: Any  # where an old out goes while the new one is renamed in
    overwrite: bool

    @classmethod
    def begin(cls, spark: Any, out: str, overwrite: bool) -> HadoopStagedDir:
        """Check ``out`` (it must not exist unless ``overwrite``) and name this export's staging dir."""
        hadoop_path = spark._jvm.org.apache.hadoop.fs.Path
        path = hadoop_path(out)
        fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
        path = fs.makeQualified(path)
        if not overwrite and fs.exists(path):
            raise ExportOutputExistsError(f"{out}: already exists (--overwrite replaces it)")
        run = uuid.uuid4().hex[:12]
        staging = hadoop_path(path.getParent(), f".{path.getName()}.rlm-export-{run}")
        aside = hadoop_path(path.getParent(), f".{path.getName()}.rlm-replaced-{run}")
        return cls(fs, path, staging, aside, overwrite)

    @property
    def staging_uri(self) -> str:
        """Where the job writes (Spark's save mode ``errorifexists``: it does not exist yet)."""
        return str(self.staging.toString())

    def commit(self) -> None:
        """Rename the staging dir to ``out``, an old ``out`` renamed aside first (``overwrite``)
        and deleted after; if the second rename fails, the old one is renamed back."""
        old = None
        if self.fs.exists(self.out):
            if not self.overwrite:  # created by someone else while we exported
                raise ExportOutputExistsError(f"{self.out}: already exists (--overwrite replaces it)")
            old = self.aside
            self._rename(self.out, old)
        try:
            self._rename(self.staging, self.out)
        except StorageError:
            if old is not None:
                self.fs.rename(old, self.out)
            raise
        if old is not None:
            self.fs.delete(old, True)

    def abort(self) -> None:
        """Remove the staging dir (what a failed job wrote; Spark's commit already removed its
        ``_temporary``)."""
        self.fs.delete(self.staging, True)

    def _rename(self, src: Any, dst: Any) -> None:
        # Hadoop's rename answers false (no exception) for most refusals.
        if not self.fs.rename(src, dst):
            raise StorageError(f"{src.toString()}: could not be renamed to {dst.toString()}")

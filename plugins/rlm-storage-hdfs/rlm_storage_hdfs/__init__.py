"""rlm storage backend ``hdfs`` (entry point group ``rlm.storage``); see :mod:`rlm_storage_hdfs.backend`."""

from rlm_storage_hdfs.backend import HdfsBackend

__all__ = ["HdfsBackend"]

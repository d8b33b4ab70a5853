"""rlm storage backend ``s3`` (entry point group ``rlm.storage``); see :mod:`rlm_storage_s3.backend`."""

from rlm_storage_s3.backend import S3Backend

__all__ = ["S3Backend"]

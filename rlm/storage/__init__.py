"""Storage layer: the backend contract, the entry-point registry and the built-in backends.

Import the pieces you need::

    from rlm.storage import StorageBackend, create_backend, RetryPolicy, put_if_absent_idempotent

Heavy SDKs (boto3, pyarrow) live only in the plugins under ``plugins/``; core imports none of them.
"""

from rlm.storage.api import Capabilities, ListPage, ObjectInfo, StorageBackend, validate_key
from rlm.storage.registry import backend_class, backend_from_config, create_backend, installed_backends
from rlm.storage.retry import RetryingBackend, RetryPolicy, put_if_absent_idempotent

__all__ = [
    "Capabilities",
    "ListPage",
    "ObjectInfo",
    "RetryPolicy",
    "RetryingBackend",
    "StorageBackend",
    "backend_class",
    "backend_from_config",
    "create_backend",
    "installed_backends",
    "put_if_absent_idempotent",
    "validate_key",
]

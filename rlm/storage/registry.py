"""Backend name → class, through the ``rlm.storage`` entry-point group (no dotted paths in config).

``[remote] backend = "s3"`` resolves the entry point ``s3`` of group ``rlm.storage`` and calls
``Backend.from_options([remote.options])``. An unknown or uninstalled name raises
:class:`~rlm.errors.BackendNotFoundError` listing the installed backends and how to install the
missing one. Third-party packages register backends the same way::

    [project.entry-points."rlm.storage"]
    gcs = "my_pkg.gcs:GcsBackend"
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from rlm.errors import BackendNotFoundError, ConfigError
from rlm.storage.api import StorageBackend
from rlm.storage.retry import with_retries

__all__ = [
    "GROUP",
    "INSTALL_HINTS",
    "backend_class",
    "backend_from_config",
    "create_backend",
    "installed_backends",
    "open_backend",
]

GROUP = "rlm.storage"

#: How to get the backends that ship in this repository but outside core.
INSTALL_HINTS: dict[str, str] = {
    "s3": "pip install ./plugins/rlm-storage-s3",
    "hdfs": "pip install ./plugins/rlm-storage-hdfs",
}


def installed_backends() -> dict[str, EntryPoint]:
    """Entry points of group ``rlm.storage`` by name (sorted)."""
    eps = {ep.name: ep for ep in entry_points(group=GROUP)}
    return dict(sorted(eps.items()))


def backend_class(name: str) -> type[StorageBackend]:
    """Load the backend class registered as ``name`` or raise BackendNotFoundError."""
    eps = installed_backends()
    ep = eps.get(name)
    if ep is None:
        hint = INSTALL_HINTS.get(
            name, f"install a package that provides entry point {name!r} in group {GROUP!r}"
        )
        raise BackendNotFoundError(
            f"unknown storage backend {name!r} ([remote] backend); installed: "
            f"{', '.join(eps) or '(none)'}; to install it: {hint}"
        )
    try:
        cls = ep.load()
    except ImportError as e:
        hint = INSTALL_HINTS.get(name, "reinstall the package that provides it")
        raise BackendNotFoundError(
            f"storage backend {name!r} is registered but cannot be imported ({e}); try: {hint}"
        ) from e
    if not (isinstance(cls, type) and issubclass(cls, StorageBackend)):
        raise BackendNotFoundError(f"entry point {name!r} ({ep.value}) is not a StorageBackend subclass")
    return cls


def create_backend(name: str, options: Mapping[str, Any] | None = None) -> StorageBackend:
    """Resolve ``name`` and build the backend from ``options`` (validated by the backend): the
    plugin itself, without retries — for wrappers around another backend (``faulty``) and for
    tests of a plugin. rlm's processes open the store with :func:`open_backend` instead."""
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"remote.backend = {name!r} is invalid: expected a backend name such as 'local' or 's3'"
        )
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(f"remote.options must be a table, got {type(options).__name__}")
    return backend_class(name).from_options(options or {})


def open_backend(
    name: str,
    options: Mapping[str, Any] | None = None,
    prefix_spread: int = 0,
    *,
    wait_s: float | None = None,
) -> StorageBackend:
    """The configured store as rlm uses it: :func:`create_backend`, then the key layout
    (``[remote] prefix_spread``) checked against the store — waiting at most ``wait_s`` seconds
    for its answer (None = as long as the backend's own timeouts) — and applied
    (rlm/storage/spread.py, docs/key-spread.md), then every call retried under the backend's
    policy: the one retry seam (:func:`~rlm.storage.retry.with_retries`, docs/storage.md). Every
    process opening the configured store goes through here: the daemon, the CLI tools, the jobs'
    driver and executors (:meth:`rlm.jobs.reading.plan.BackendSpec.create`)."""
    from rlm.storage.spread import open_spread

    return with_retries(open_spread(create_backend(name, options), prefix_spread, wait_s=wait_s))


def backend_from_config(remote: Mapping[str, Any]) -> StorageBackend:
    """Build the backend of a parsed ``[remote]`` table: ``{"backend": ..., "options": {...}}``,
    its calls retried as :func:`open_backend`'s are (the layout is checked on the first call)."""
    # The health keys (unreachable_after_ms, probe_interval_ms) belong to rlm.storage.health, not
    # to the backend; rlm.config validates them.
    allowed = {"backend", "options", "unreachable_after_ms", "probe_interval_ms", "prefix_spread"}
    unknown = sorted(set(remote) - allowed)
    if unknown:
        raise ConfigError(
            f"unknown key(s) in [remote]: {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )
    if "backend" not in remote:
        raise ConfigError('remote.backend is required (e.g. backend = "local")')
    backend = create_backend(remote["backend"], remote.get("options"))
    from rlm.storage.spread import MAX_SPREAD, SpreadBackend

    spread = remote.get("prefix_spread", 0)
    if not isinstance(spread, int) or isinstance(spread, bool) or not 0 <= spread <= MAX_SPREAD:
        raise ConfigError(f"remote.prefix_spread = {spread!r} is invalid: expected an integer 0-{MAX_SPREAD}")
    if not spread:
        return with_retries(backend)
    return with_retries(SpreadBackend(backend, spread))  # no I/O here: checked on the first call

"""What several commands share: the ``--config`` option, building the manager, progress output."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from rlm.config import Settings, load_settings
from rlm.daemon.logs import configure
from rlm.errors import ConfigError
from rlm.storage.api import StorageBackend
from rlm.storage.health import HealthTrackingBackend, StoreHealth
from rlm.storage.registry import open_backend
from rlm.tiering.manager import RemoteLogManager

__all__ = [
    "build_manager",
    "config_option",
    "interactive",
    "load",
    "open_store",
    "partition_progress",
    "require_dirs",
    "settings_for_tool",
    "tracked_backend",
]

F = TypeVar("F", bound=Callable[..., Any])


def config_option(func: F) -> F:
    return click.option(
        "--config",
        "config_path",
        required=True,
        type=click.Path(path_type=Path),
        help="TOML configuration file (docs/configuration.md).",
    )(func)


def load(config_path: Path) -> Settings:
    return load_settings(config_path)


def settings_for_tool(config_path: Path) -> Settings:
    """For the short-lived commands: warnings-only logs, validated config, log dirs present."""
    configure("text", logging.WARNING)
    # The store-health transitions are the daemon's log lines; a one-shot command reports a store
    # failure once, in its own `rlm: error:` / `rlm: warning:` line (docs/operations.md).
    logging.getLogger("rlm.storage.health").setLevel(logging.CRITICAL)
    settings = load(config_path)
    require_dirs(settings)
    return settings


def build_manager(settings: Settings) -> RemoteLogManager:
    backend = open_store(settings)
    return RemoteLogManager(settings, backend)  # wraps it in the store-health tracker


def tracked_backend(settings: Settings) -> StorageBackend:
    """The configured backend behind a store-health tracker, for commands without a manager
    (``rlm lookup``/``fetch``): an unreachable store ends them after ``remote.unreachable_after_ms``
    instead of every retry layer's worth of timeouts (docs/operations.md)."""
    health = StoreHealth(
        unreachable_after_ms=settings.remote.unreachable_after_ms,
        probe_interval_ms=settings.remote.probe_interval_ms,
    )
    return HealthTrackingBackend(open_store(settings), health)


def open_store(settings: Settings) -> StorageBackend:
    """The configured backend with its key layout checked and applied (docs/key-spread.md); a
    store that has not answered within ``remote.unreachable_after_ms`` is checked later, so the
    daemon starts (and serves local data) during an outage."""
    remote = settings.remote
    return open_backend(
        remote.backend, remote.options, remote.prefix_spread, wait_s=remote.unreachable_after_ms / 1000
    )


def interactive(quiet: bool = False) -> bool:
    """Progress bars only on a terminal, never when piped or with --quiet."""
    return not quiet and sys.stderr.isatty()


@contextmanager
def partition_progress(
    manager: RemoteLogManager, desc: str, quiet: bool = False
) -> Iterator[Callable[[str], None]]:
    """A per-partition tqdm bar on stderr (only on a terminal, see :func:`interactive`); yields
    the ``on_partition(name)`` callback the manager calls as it reaches each partition."""
    from tqdm import tqdm

    enabled = interactive(quiet)
    total = len(manager.discover()) if enabled else None
    with tqdm(total=total, unit="partition", desc=desc, disable=not enabled) as bar:
        started = False

        def step(name: str) -> None:
            nonlocal started
            if started:
                bar.update(1)
            started = True
            bar.set_postfix_str(name, refresh=False)

        yield step
        if started:
            bar.update(1)


def require_dirs(settings: Settings) -> None:
    missing = [str(d) for d in settings.log.dirs if not d.is_dir()]
    if missing:
        raise ConfigError(f"log.dirs: {', '.join(missing)} is not a directory ({settings.source})")

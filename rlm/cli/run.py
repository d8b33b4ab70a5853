"""``rlm run``, ``rlm status``, ``rlm gc`` (docs/cli.md)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rlm.cli.common import (
    build_manager,
    config_option,
    interactive,
    load,
    partition_progress,
    require_dirs,
    settings_for_tool,
)
from rlm.cli.errors import EXIT_FAILURE, handle_errors
from rlm.cli.output import emit_json
from rlm.config import Settings
from rlm.config.exposure import check_exposure
from rlm.daemon.lock import StateDirLock
from rlm.daemon.logs import configure
from rlm.errors import ConfigError
from rlm.tiering.converge import OldIncarnation
from rlm.tiering.local import state_root_of
from rlm.tiering.manager import PassResult, RemoteLogManager

if TYPE_CHECKING:
    from rlm.cli.wiring import DaemonApi
    from rlm.kafka.server import KafkaListener

__all__ = ["gc", "owned_state_dirs", "run", "status"]


def owned_state_dirs(settings: Settings) -> list[Path]:
    """The state roots ``rlm run`` writes (the manager's own rule, once per distinct root)."""
    return list(dict.fromkeys(state_root_of(settings.tiering, Path(d)) for d in settings.log.dirs))


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@click.command("run")
@config_option
@click.option("--once", is_flag=True, help="One full pass (discover, copy, index, retention, GC), then exit.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@handle_errors
def run(config_path: Path, once: bool, log_format: str, quiet: bool) -> None:
    """Run the tiering daemon (or one pass with --once)."""
    settings = load(config_path)
    configure(log_format, logging.WARNING if once and not quiet and interactive() else logging.INFO)
    if not once:  # it will listen: exposed without TLS and auth is refused (docs/security.md §6)
        check_exposure(settings)
    require_dirs(settings)
    with StateDirLock(owned_state_dirs(settings)):  # one rlm run per state dir: docs/operations.md
        manager = build_manager(settings)
        if once:
            _once(manager, quiet)
        else:
            _daemon(settings, manager)


def _daemon(settings: Settings, manager: RemoteLogManager) -> None:
    """The scheduler plus the HTTP API, until SIGTERM/SIGINT."""
    from rlm.cli.wiring import build_api
    from rlm.daemon.allocator import tune_allocator
    from rlm.daemon.scheduler import TieringDaemon, tune_gc
    from rlm.http.server import ApiServer
    from rlm.http.tls import serving_context

    tls = serving_context(settings.server)  # a bad cert/key: one line, before anything starts
    tune_allocator()  # before the first store read: its buffers' memory serves the next ones
    daemon = TieringDaemon(manager)
    daemon.handle_signals()  # before the API answers: a SIGTERM from then on is a clean stop
    parts = build_api(settings, manager)
    kafka = _kafka_listener(settings, parts)  # bound, certificate and users loaded: or fail now
    history = parts.history.start()
    if kafka is not None:  # accepting before /healthz answers: a healthy daemon serves both
        kafka.start()
        logging.getLogger("rlm").info("Kafka listener on %s (%s)", kafka.address, kafka.security_protocol)
    api = ApiServer.for_settings(parts.app, settings.server, tls).start()
    logging.getLogger("rlm").info("HTTP API on %s (status page at /, docs at /docs)", api.url)
    tune_gc()  # after the imports and the app: they are frozen out of every collection
    try:
        daemon.run_forever()
    finally:
        if kafka is not None:
            kafka.stop()
        api.stop()
        history.stop()
        parts.readers.close()


def _kafka_listener(settings: Settings, parts: DaemonApi) -> KafkaListener | None:
    """The read-only Kafka-protocol listener (not started) when ``[kafka] listen`` is set
    (docs/kafka-listener.md)."""
    if not settings.kafka.listen:
        return None
    try:
        from rlm.kafka.api import KafkaApi
        from rlm.kafka.server import KafkaListener
    except ImportError as err:
        raise ConfigError(
            f"config key kafka.listen is set but {err.name or 'kafka-python'} is not "
            "installed: pip install 'rlm[kafka]' (kafka-python 3)"
        ) from None

    from rlm.config.brokers import coordinator_servers
    from rlm.kafka.coordinator import Coordinator
    from rlm.kafka.upstream import UpstreamSecurity

    api = KafkaApi(
        parts.readers,
        node_id=settings.cluster.node_id or 0,
        deleter=parts.delete_records,
        max_fetch_sessions=settings.kafka.max_fetch_sessions,
    )
    servers = coordinator_servers(settings.cluster, settings.kafka)
    coordinator = (
        Coordinator(
            servers,
            node_id=api.node_id,
            timeout_s=settings.kafka.idle_timeout_ms / 1000,
            security=UpstreamSecurity.of_cluster(settings.cluster),
        )
        if servers
        else None
    )
    return KafkaListener(api, settings.kafka, metrics=parts.kafka_metrics, coordinator=coordinator)


def _once(manager: RemoteLogManager, quiet: bool) -> None:
    """One full pass with a progress bar; a JSON summary on stdout, exit 1 if a partition failed."""
    parts = manager.discover()
    from tqdm import tqdm

    with tqdm(total=len(parts), unit="partition", disable=not interactive(quiet), desc="tiering") as bar:
        copied = {"segments": 0, "bytes": 0}

        def done(r: PassResult) -> None:
            copied["segments"] += len(r.copied)
            copied["bytes"] += r.copied_bytes
            bar.set_postfix_str(
                f"{r.topic}-{r.partition}, copied {copied['segments']} segments "
                f"/ {_human_bytes(copied['bytes'])}",
                refresh=False,
            )
            bar.update(1)

        results = manager.run_once(on_result=done, gc=False)
    failed = [r for r in results if r.error]
    summary = {
        "partitions": len(results),
        "segments_copied": sum(len(r.copied) for r in results),
        "segments_deleted": sum(len(r.deleted) for r in results),
        "errors": {f"{r.topic}-{r.partition}": r.error for r in failed},
        "gc": _gc_if_due(manager, failed=bool(failed)),
    }
    emit_json(summary)
    if failed:
        for r in failed:
            click.echo(f"rlm: error: {r.topic}-{r.partition}: {r.error}", err=True)
        raise SystemExit(EXIT_FAILURE)


def _gc_if_due(manager: RemoteLogManager, *, failed: bool) -> dict[str, Any]:
    """GC after the passes only when due (docs/operations.md "GC"): it lists every partition in
    the store, most of an idle ``--once``'s cost. Its summary entry says whether it ran and why."""
    due, why = manager.gc_schedule.due(manager.shared.clock_ms())
    if failed and not due:
        due, why = True, "a pass failed and may have left an attempt behind"
    if not due or manager.shared.stop.is_set():
        return {"ran": False, "why": why}
    logging.getLogger(__name__).info("gc: %s", why)
    manager.collect_garbage(save_stamps=True)  # `run` holds the state-dir lock
    return {"ran": True, "why": why}


@click.command("status")
@config_option
@handle_errors
def status(config_path: Path) -> None:
    """Per-partition tiering state as JSON (safe-to-delete point = highest_tiered_offset)."""
    manager = build_manager(settings_for_tool(config_path))
    emit_json(manager.status())
    for pins in manager.shared.pins.summary():  # docs/operations.md "Pins and the broker's retention"
        if pins["bound_reached"]:
            click.echo(
                f"rlm: warning: {pins['log_dir']}: pinned segment files reached tiering.max_pinned_bytes "
                f"({pins['pinned_bytes']} of {pins['max_pinned_bytes']} bytes): pending segments of "
                f"{pins['partitions_refused']} partitions are not pinned and the broker may delete them "
                "before they are tiered",
                err=True,
            )
    store = manager.health.snapshot()
    if not store["reachable"]:
        click.echo(
            f"rlm: warning: remote store unreachable for {store['unreachable_for_ms'] // 1000} s "
            f"(remote_segments/remote_bytes may be stale): {store['last_error']}",
            err=True,
        )


@click.command("gc")
@config_option
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@handle_errors
def gc(config_path: Path, dry_run: bool, quiet: bool) -> None:
    """Delete objects of abandoned copy attempts older than tiering.gc_grace_ms, old topic
    incarnations older than tiering.old_incarnation_grace_ms and deleted topics older than
    tiering.deleted_topic_grace_ms (unless kept)."""
    manager = build_manager(settings_for_tool(config_path))
    with partition_progress(manager, "gc", quiet) as step:
        old: list[OldIncarnation] = []
        deleted: list[OldIncarnation] = []
        orphans = manager.collect_garbage(dry_run=dry_run, on_partition=step, old=old, deleted=deleted)
    for orphan in orphans:
        emit_json(
            {
                "topic": orphan.topic,
                "partition": orphan.partition,
                "base_offset": orphan.base_offset,
                "attempt": orphan.attempt_id,
                "objects": list(orphan.keys),
                "bytes": orphan.bytes,
                "age_ms": orphan.age_ms,
                "deleted": not dry_run,
            }
        )
    for inc in old:  # a re-created topic's predecessor (docs/topic-identity.md)
        emit_json(
            {
                "topic": inc.topic,
                "partition": inc.partition,
                "old_incarnation": inc.to_json(),
                "bytes": inc.bytes,
                "deleted": inc.deleted,
            }
        )
    for inc in deleted:  # a topic deleted and not re-created (docs/topic-identity.md)
        emit_json(
            {
                "topic": inc.topic,
                "partition": inc.partition,
                "deleted_topic": inc.to_json(),
                "bytes": inc.bytes,
                "deleted": inc.deleted,
            }
        )

"""``rlm delete-records`` (docs/cli.md): rlm's DeleteRecords from the command line.

One writer per partition: when an ``rlm run`` owns the state dirs (their lock is held), the
request goes to that daemon's HTTP API (``[server]`` of the same config: address, TLS, token),
which applies it under the partition's pass lock, so its in-memory state and every surface it
serves change at once. Without a running daemon the command takes the state-dir lock itself and
applies it in-process (rlm/tiering/delete_records.py). Either way the answer is one JSON line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rlm.cli.common import build_manager, config_option, settings_for_tool
from rlm.cli.errors import handle_errors
from rlm.cli.output import emit_json
from rlm.cli.run import owned_state_dirs
from rlm.config import Settings
from rlm.daemon.lock import StateDirLock
from rlm.errors import (
    ForbiddenError,
    InvalidArgumentError,
    NotLeaderError,
    OffsetOutOfRangeError,
    PartitionNotFoundError,
    RlmError,
    RlmHttpError,
    StateDirLockedError,
)
from rlm.http.client import RlmClient
from rlm.tiering.delete_records import delete_records as apply_delete_records

__all__ = ["delete_records"]

#: A daemon's HTTP answer → the error class the command raises (its exit code, docs/cli.md §1).
_BY_STATUS: dict[int, type[RlmError]] = {
    400: InvalidArgumentError,
    403: ForbiddenError,
    404: PartitionNotFoundError,
    416: OffsetOutOfRangeError,
    421: NotLeaderError,
}


def _through_daemon(settings: Settings, topic: str, partition: int, before: int) -> dict[str, Any]:
    try:
        with RlmClient.for_server(settings.server) as client:
            return client.delete_records(topic, partition, before)
    except RlmHttpError as err:
        cls = _BY_STATUS.get(err.status)
        if cls is None:
            raise
        raise cls(f"rlm run (HTTP API): {err.server_reason}") from None


@click.command("delete-records")
@config_option
@click.option("--topic", required=True)
@click.option("--partition", required=True, type=click.IntRange(min=0))
@click.option(
    "--before",
    required=True,
    type=click.IntRange(min=-1),
    help="the new log start: records below it are no longer served and remote segments wholly "
    "below it are deleted; -1 = the high watermark",
)
@handle_errors
def delete_records(config_path: Path, topic: str, partition: int, before: int) -> None:
    """Delete the records below --before (Kafka's DeleteRecords, on rlm's history): one JSON object."""
    settings = settings_for_tool(config_path)
    lock = StateDirLock(owned_state_dirs(settings))
    try:
        lock.acquire()
    except StateDirLockedError:
        emit_json(_through_daemon(settings, topic, partition, before))
        return
    try:
        emit_json(apply_delete_records(build_manager(settings), topic, partition, before).to_json())
    finally:
        lock.release()

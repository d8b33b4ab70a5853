"""The one route that deletes (docs/http-api.md §7): ``POST /v1/topics/{t}/partitions/{p}/delete-records``.

rlm's DeleteRecords (rlm/tiering/delete_records.py). It needs ``[server] token``: without one
nobody can be authenticated, so the route answers **403** to every request instead of deleting for
anyone who can reach the port (the read routes stay open then, as documented in docs/security.md).
With a token, the usual guard answers 401 to a request without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.params import Depends as DependsParam
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from rlm.config import ServerSettings
from rlm.config.server import bearer_token
from rlm.errors import ForbiddenError
from rlm.tiering.delete_records import DeletedRecords

__all__ = ["DeleteRecordsRequest", "DeleteRecordsSource", "install_admin_routes"]

#: ``(topic, partition, before) -> answer``: the daemon's :func:`rlm.tiering.delete_records.delete_records`.
DeleteRecordsSource = Callable[[str, int, int], DeletedRecords]


class DeleteRecordsRequest(BaseModel):
    before: int = Field(description="the new log start (records below it go); -1 = the high watermark")


def install_admin_routes(
    app: FastAPI, server: ServerSettings, auth: list[DependsParam], delete: DeleteRecordsSource | None
) -> None:
    """The delete-records route; ``delete`` None (no manager in this process): not installed."""
    if delete is None:
        return
    guarded = bool(bearer_token(server))

    @app.post("/v1/topics/{topic}/partitions/{partition}/delete-records", tags=["admin"], dependencies=auth)
    async def delete_records(topic: str, partition: int, body: DeleteRecordsRequest) -> dict[str, Any]:
        if not guarded:
            raise ForbiddenError("delete-records needs [server] token (or token_file): refused without one")
        answer = await run_in_threadpool(delete, topic, partition, body.before)
        return answer.to_json()

"""Lookup routes (docs/http-api.md §2): where is an offset, which offset is at a time, and the
offsets of every partition at a time (the consumer-group reset file of ``rlm offsets-for-times``)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.params import Depends as DependsParam
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from rlm.tiering.read import TieredReaders, check_topic_name

__all__ = ["OffsetsForTimesRequest", "install_lookup_routes"]


class OffsetsForTimesRequest(BaseModel):
    timestamp: int = Field(description="ms since the epoch, or -1 latest / -2 earliest")
    topics: list[str] | None = Field(default=None, description="default: every topic")
    minus_ms: int = Field(default=0, ge=0, description="safety margin subtracted from timestamp")


def install_lookup_routes(app: FastAPI, readers: TieredReaders, auth: list[DependsParam]) -> None:
    """``GET .../offsets/{offset}``, ``GET .../timestamps/{timestamp}``, ``POST
    /v1/offsets-for-times``; each answers ``LookupResult.to_json`` rows (docs/cli.md)."""

    @app.get("/v1/topics/{topic}/partitions/{partition}/offsets/{offset}", tags=["lookup"], dependencies=auth)
    async def by_offset(topic: str, partition: int, offset: int) -> dict[str, Any]:
        check_topic_name(topic)
        reader = readers.reader(topic, partition)
        result = await run_in_threadpool(reader.lookup_offset, offset)
        return result.to_json()

    @app.get(
        "/v1/topics/{topic}/partitions/{partition}/timestamps/{timestamp}", tags=["lookup"], dependencies=auth
    )
    async def by_timestamp(topic: str, partition: int, timestamp: int) -> dict[str, Any]:
        reader = readers.reader(topic, partition)
        result = await run_in_threadpool(reader.lookup_timestamp, timestamp)
        return result.to_json()

    @app.post("/v1/offsets-for-times", tags=["lookup"], dependencies=auth)
    async def offsets_for_times(body: OffsetsForTimesRequest) -> list[dict[str, Any]]:
        rows = await run_in_threadpool(readers.offsets_for_times, body.timestamp, body.topics, body.minus_ms)
        return [
            {
                "topic": r.topic,
                "partition": r.partition,
                "offset": r.offset,
                "timestamp": r.timestamp,
                "tier": r.tier,
            }
            for r in rows
        ]

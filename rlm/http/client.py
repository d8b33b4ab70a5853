"""A small Python client for the rlm HTTP API (httpx), mirroring the routes one to one."""

from __future__ import annotations

from typing import Any

import httpx

from rlm.errors import RlmError


class RlmHttpError(RlmError):
    """A 4xx/5xx answer: ``status``, and the ``field`` the server blamed (None when global)."""

    def __init__(self, status: int, field: str | None, reason: str) -> None:
        super().__init__(f"HTTP {status}: {reason}" + (f" (field {field})" if field else ""))
        self.status = status
        self.field = field


class RlmClient:
    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RlmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, resp: httpx.Response) -> httpx.Response:
        if resp.status_code >= 400:
            try:
                err = resp.json()["error"]
                raise RlmHttpError(resp.status_code, err.get("field"), err.get("reason", ""))
            except (ValueError, KeyError, TypeError):
                raise RlmHttpError(resp.status_code, None, resp.text[:200]) from None
        return resp

    def _get(self, path: str, **params: Any) -> Any:
        return self._check(self._http.get(path, params=params or None)).json()

    def _object(self, path: str, **params: Any) -> dict[str, Any]:
        doc: dict[str, Any] = self._get(path, **params)
        return doc

    def _rows(self, doc: Any) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = doc
        return rows

    def healthz(self) -> dict[str, Any]:
        return self._object("/healthz")

    def partitions(self) -> list[dict[str, Any]]:
        return self._rows(self._get("/v1/partitions"))

    def lookup_offset(self, topic: str, partition: int, offset: int) -> dict[str, Any]:
        return self._object(f"/v1/topics/{topic}/partitions/{partition}/offsets/{offset}")

    def lookup_timestamp(self, topic: str, partition: int, timestamp: int) -> dict[str, Any]:
        return self._object(f"/v1/topics/{topic}/partitions/{partition}/timestamps/{timestamp}")

    def fetch_raw(self, topic: str, partition: int, offset: int,
                  max_bytes: int = 1 << 20) -> tuple[bytes, dict[str, str]]:
        """Raw batches and the X-Rlm-* headers (tier, next offset, high watermark)."""
        resp = self._check(self._http.get(f"/v1/topics/{topic}/partitions/{partition}/records",
                                          params={"offset": offset, "max_bytes": max_bytes}))
        return resp.content, {k: v for k, v in resp.headers.items() if k.lower().startswith("x-rlm-")}

    def fetch_json(self, topic: str, partition: int, offset: int,
                   max_bytes: int = 1 << 20) -> dict[str, Any]:
        return self._object(f"/v1/topics/{topic}/partitions/{partition}/records",
                         offset=offset, max_bytes=max_bytes, format="json")

    def offsets_for_times(self, timestamp: int, topics: list[str] | None = None,
                          minus_ms: int = 0) -> list[dict[str, Any]]:
        body = {"timestamp": timestamp, "topics": topics, "minus_ms": minus_ms}
        return self._rows(self._check(self._http.post("/v1/offsets-for-times", json=body)).json())

    def metrics(self) -> str:
        return self._check(self._http.get("/metrics")).text

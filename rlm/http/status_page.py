"""The status page at ``/``: static HTML/JS/CSS from ``rlm/http/static`` (no build step, no
auth — its API calls carry the token the user gives it; docs/http-api.md)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["STATIC_DIR", "install_status_page"]

STATIC_DIR = Path(__file__).resolve().parent / "static"


def install_status_page(app: FastAPI) -> None:
    """Serve ``/static/*`` and ``/`` (``index.html``, never cached: a new rlm serves a new page)."""
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

"""No store request runs where waiting is refused (rlm/nowait.py; the Kafka listener's event loop):
each request method of the storage API raises BlockingIOError before it reaches the backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rlm.nowait import without_waiting
from rlm.storage.api import StorageBackend
from rlm.storage.local import LocalBackend

REQUESTS: dict[str, Callable[[StorageBackend, Path], object]] = {
    "put": lambda b, _: b.put("k/new", b"x"),
    "upload_file": lambda b, src: b.upload_file("k/new", src),
    "read": lambda b, _: b.read("k/old"),
    "head": lambda b, _: b.head("k/old"),
    "list_page": lambda b, _: b.list_page("k/"),
    "delete": lambda b, _: b.delete("k/old"),
}


@pytest.mark.parametrize("request_", sorted(REQUESTS))
def test_no_store_request_where_waiting_is_refused(tmp_path: Path, request_: str) -> None:
    store = LocalBackend(root=str(tmp_path / "store"))
    store.put("k/old", b"old")
    src = tmp_path / "src"
    src.write_bytes(b"new")
    with without_waiting(), pytest.raises(BlockingIOError, match="a store request"):
        REQUESTS[request_](store, src)
    assert sorted(o.key for o in store.list("k/")) == ["k/old"]
    assert store.read("k/old") == b"old"
    REQUESTS[request_](store, src)  # and the same request outside runs

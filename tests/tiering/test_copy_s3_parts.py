"""The copier's ``.log`` upload to S3 by file regions (rlm.storage.filestream, #35): each part is
read from the file on the thread that sends it. Against the session's SeaweedFS, through the
copier's own upload (``rlm.tiering.copy.upload.upload_file``) with the store wrapped as the daemon
wraps it: the bytes stored and the CRC-32C returned are the file's, a retried part re-sends its
whole bytes, the shared token bucket still bounds the rate, a cancel still abandons the upload, and
a file truncated while it uploads fails the copy with nothing published or left open."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import crc32c
import pytest

from rlm.cli.generate import generate_log_dir
from rlm.config import load_settings
from rlm.errors import StorageError, UploadAbandoned
from rlm.storage.registry import open_backend
from rlm.testing.backend_suite import payload
from rlm.testing.configs import write_config
from rlm.testing.faultproxy import FaultProxy
from rlm.tiering.copy.upload import UploadControl, upload_file
from rlm.tiering.local import PartitionContext
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.local.throttle import TokenBucket
from rlm.tiering.manager import RemoteLogManager
from tests.s3servers import S3Target

pytestmark = [pytest.mark.s3, pytest.mark.integration]
pytest.importorskip("rlm_storage_s3")

MiB = 1 << 20
SIZE = 11 * MiB + 123  # three 5 MiB parts
RATE = 4 * MiB  # bytes/second of the throttle test's bucket (its burst: one second's worth)


class FakeBucket(TokenBucket):
    """The real token bucket on a clock that only moves when a taker sleeps; records the bytes
    taken, which threads took them, and calls ``on_sleep`` (a test's mid-upload action)."""

    def __init__(self, rate: float, on_sleep: Callable[[], None] | None = None) -> None:
        self.now = 1000.0
        self.taken = 0
        self.threads: set[str] = set()
        self.on_sleep = on_sleep
        self._count = threading.Lock()
        super().__init__(rate, clock=lambda: self.now, sleep=self._sleep)

    def _sleep(self, seconds: float) -> None:
        with self._count:
            self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep()

    def take(self, n: int) -> None:
        with self._count:
            self.taken += n
            self.threads.add(threading.current_thread().name)
        super().take(n)


@pytest.fixture
def proxy(s3_target: S3Target) -> Iterator[FaultProxy]:
    with FaultProxy(s3_target.endpoint) as p:
        yield p


def _context(tmp_path: Path, s3_target: S3Target, proxy: FaultProxy) -> tuple[PartitionContext, Any]:
    """A partition's copy context over the s3 store as the daemon opens it (retries, metering,
    health), 5 MiB parts, through ``proxy``; and a raw client for checks behind its back."""
    logs = tmp_path / "logs"
    generate_log_dir(logs, [("t", 1)], seed=3, records=20, segment_bytes=8 * 1024)
    options = s3_target.options(
        endpoint_url=proxy.endpoint,
        part_size="5MiB",
        max_concurrency=2,
        max_attempts=3,
        retry_base_delay=0.01,
        retry_max_delay=0.05,
    )
    cfg = write_config(tmp_path / "c.toml", [logs], backend="s3", options=options)
    manager = RemoteLogManager(load_settings(cfg), open_backend("s3", options), metrics=TieringMetrics())
    return manager.context(manager.discover()[0]), s3_target.client()


def _file(tmp_path: Path) -> tuple[Path, bytes]:
    data = payload(SIZE, 11)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    return path, data


def _left_behind(client: Any, s3_target: S3Target, key: str) -> list[str]:
    """Objects and open multipart uploads under the test's prefix whose key ends with ``key``."""
    objs = client.list_objects_v2(Bucket=s3_target.bucket, Prefix=s3_target.prefix).get("Contents", [])
    ups = client.list_multipart_uploads(Bucket=s3_target.bucket, Prefix=s3_target.prefix).get("Uploads", [])
    return [o["Key"] for o in objs + ups if o["Key"].endswith(key)]


def test_parts_read_on_their_threads_retried_part_resends_its_bytes_throttle_bounds(
    tmp_path: Path, s3_target: S3Target, proxy: FaultProxy
) -> None:
    ctx, client = _context(tmp_path, s3_target, proxy)
    path, data = _file(tmp_path)
    ctx.shared.bucket = bucket = FakeBucket(RATE)
    proxy.fail("upload_part", "500")  # refused before the store kept anything
    proxy.fail("upload_part", "lost_ack")  # stored, then the answer lost: the re-send must match

    stored = upload_file(ctx, "obj.log", path, watch_half=True)

    assert ctx.shared.backend.read("obj.log") == data
    assert (stored.size, stored.crc32c) == (SIZE, crc32c.crc32c(data))
    assert proxy.seen["upload_part"] == 3 + 2
    # Every byte paid the bucket once, on the part threads (none read ahead on this one), and
    # the bucket held the upload to its rate: beyond the first second's burst, SIZE / RATE s.
    assert bucket.taken == SIZE
    assert bucket.threads and all(t.startswith("rlm-s3-part") for t in bucket.threads), bucket.threads
    assert bucket.now - 1000.0 >= (SIZE - RATE) / RATE - 1e-6
    client.close()


@pytest.mark.parametrize(("by", "says"), [("cancel", "cancelled"), ("shutdown", "shutting down")])
def test_cancel_or_shutdown_mid_upload_abandons_it(
    tmp_path: Path, s3_target: S3Target, proxy: FaultProxy, by: str, says: str
) -> None:
    ctx, client = _context(tmp_path, s3_target, proxy)
    path, _ = _file(tmp_path)
    control = UploadControl()
    event = control.cancel if by == "cancel" else ctx.shared.stop
    ctx.shared.bucket = bucket = FakeBucket(RATE, on_sleep=event.set)  # set once parts are under way

    with pytest.raises(UploadAbandoned, match=says):
        upload_file(ctx, "cancelled.log", path, control=control)

    assert 0 < bucket.taken < SIZE and control.sending.is_set()
    assert _left_behind(client, s3_target, "cancelled.log") == []  # aborted, nothing published
    client.close()


def test_file_truncated_mid_upload_fails_the_copy_and_publishes_nothing(
    tmp_path: Path, s3_target: S3Target, proxy: FaultProxy
) -> None:
    ctx, client = _context(tmp_path, s3_target, proxy)
    path, _ = _file(tmp_path)

    def truncate() -> None:  # a broker truncating the log in place, mid-upload
        with path.open("r+b") as f:
            f.truncate(6 * MiB)

    ctx.shared.bucket = FakeBucket(RATE, on_sleep=truncate)

    with pytest.raises(StorageError, match="shrank") as err:
        upload_file(ctx, "cut.log", path)

    assert str(path) in str(err.value)
    assert _left_behind(client, s3_target, "cut.log") == []  # aborted, nothing published
    client.close()

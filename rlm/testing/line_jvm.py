"""A JVM driven one line at a time: the launchers of rlm's test runtimes (``tools/hdfs/MiniHdfs.java``,
``tools/iceberg-spark/IcebergSparkSql.java``) print ``ready …`` once up, then read one command
per line on stdin and answer each with one ``ok …`` or ``error <message>`` line on stdout. Their
own logs go to files, never to that channel; stderr goes to a file too.

:class:`LineJvm` is the channel: it starts the process in a session of its own (so it is stopped
by pid with its children), pumps stdout lines into a queue from a thread, waits for an answer
with a deadline, and stops the process (``stop``, then SIGKILL of the group)."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = ["LineJvm"]


@dataclass
class LineJvm:
    """The command channel of one launcher JVM. ``name`` and ``log`` only word its errors."""

    name: str
    log: Path
    _proc: subprocess.Popen[str] | None = field(default=None, init=False, repr=False)
    _lines: queue.Queue[str | None] = field(default_factory=queue.Queue, init=False, repr=False)
    _stderr: IO[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self, cmd: list[str], stderr: Path, env: Mapping[str, str] | None = None) -> None:
        """Run ``cmd`` (stderr appended to ``stderr``); its stdout lines are answers from now on."""
        self._lines = queue.Queue()
        self._stderr = open(stderr, "ab")  # noqa: SIM115 - closed by close()
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
        threading.Thread(target=self._pump, args=(self._proc.stdout,), daemon=True).start()

    def _pump(self, out: IO[str] | None) -> None:
        assert out is not None
        for line in out:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def answer(self, prefix: str, timeout: float) -> str:
        """The next line starting with ``prefix``, without it (stripped); RuntimeError on an
        ``error`` line, on the process's exit, or after ``timeout`` seconds (naming the log)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{self.name}: no {prefix!r} within {timeout:.0f} s; see {self.log}")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                code = self._proc.wait() if self._proc is not None else None
                raise RuntimeError(f"{self.name} exited with {code} before {prefix!r}; see {self.log}")
            if line.startswith("error "):
                raise RuntimeError(f"{self.name}: {line[6:]}")
            if line.startswith(prefix):
                return line[len(prefix) :].strip()

    def command(self, line: str, answer: str, timeout: float) -> str:
        """Send one command line and wait for the answer starting with ``answer``."""
        if "\n" in line:
            raise ValueError("one command is one line")
        if self._proc is None or self._proc.stdin is None or self._proc.poll() is not None:
            raise RuntimeError(f"{self.name} is not running")
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()
        return self.answer(answer, timeout)

    def close(self, timeout: float) -> None:
        """Stop cleanly (``stop``), else SIGKILL the process group by pid."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None and proc.stdin is not None:
            try:
                proc.stdin.write("stop\n")
                proc.stdin.flush()
                proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        for pipe in (proc.stdin, proc.stdout, self._stderr):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        self._stderr = None

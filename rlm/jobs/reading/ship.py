"""What every executor must share with the driver: the same build of rlm (docs/spark-cluster.md).

Jobs ship data, not code — tasks are pickled rlm classes, the store a
:class:`~rlm.jobs.reading.plan.BackendSpec` — so an executor with another rlm would unpickle them
into other code: a missing field, a changed rule, or a silently different result. The driver stamps
its build on the ``BackendSpec``; each executor's Python worker compares it with its own once,
before its first task touches the store.
"""

from __future__ import annotations

import functools
import hashlib
import socket
import sys
from pathlib import Path

import rlm
from rlm.errors import ExecutorEnvironmentError

__all__ = ["UNHASHED", "check_build", "rlm_build"]

#: The digest part when rlm's sources are not files (imported from a zip): only versions compare.
UNHASHED = "unhashed"


@functools.cache
def rlm_build() -> str:
    """``<version>+<16 hex digits>``: rlm's version and a SHA-256 of its ``.py`` sources (names and
    bytes). Editable, wheel and packed-venv installs of the same sources agree; about 10 ms once
    per process."""
    root = Path(rlm.__file__).parent
    if not root.is_dir():
        return f"{rlm.__version__}+{UNHASHED}"
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return f"{rlm.__version__}+{digest.hexdigest()[:16]}"


def check_build(driver_build: str) -> None:
    """Raise :class:`ExecutorEnvironmentError` unless this process runs ``driver_build`` ("" = not
    stamped: no check)."""
    mine = rlm_build()
    if not driver_build or driver_build == mine:
        return
    if (
        UNHASHED in (driver_build.rpartition("+")[2], mine.rpartition("+")[2])
        and driver_build.partition("+")[0] == mine.partition("+")[0]
    ):
        return
    raise ExecutorEnvironmentError(
        f"executor host {socket.gethostname()} runs rlm {mine} from {Path(rlm.__file__).parent} "
        f"(python {sys.executable}), the driver rlm {driver_build}: install the driver's rlm on the "
        "executors or ship its environment (docs/spark-cluster.md)"
    )

"""How the CLI turns errors into exit codes and one-line messages (never a traceback).

Exit codes (docs/cli.md §1): 0 success; 1 a corrupt/unreadable input or a failed operation;
2 bad arguments or invalid configuration. The error's class decides (``RlmError.exit_code`` in
rlm/errors.py, the one table the HTTP API and the Kafka listener read too). ``RLM_DEBUG=1``
re-raises for a full traceback.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import click

from rlm.errors import RlmError

__all__ = ["EXIT_FAILURE", "exit_code_for", "handle_errors", "report", "spark_task_failure"]

P = ParamSpec("P")
R = TypeVar("R")

EXIT_FAILURE = 1


def exit_code_for(err: BaseException) -> int:
    """The exit code of an rlm error's class (2 for configuration/argument errors and an unknown
    backend, 1 for the others); 1 for any other exception (an OS error, a bug)."""
    return err.exit_code if isinstance(err, RlmError) else EXIT_FAILURE


#: A Python exception line of a traceback (``rlm.errors.LogDirError: ...``), not a JVM one.
_PY_EXCEPTION_LINE = re.compile(
    r"^(?!(?:org|java|javax|scala|py4j)\.)(?:\w+\.)*\w*(?:Error|Exception): .*$", re.MULTILINE
)


def spark_task_failure(err: BaseException) -> str | None:
    """For a failed Spark job (a pyspark/py4j exception on the driver, its text a JVM report with
    the executor's Python traceback inside), the executor's exception line; else None. The last
    such line: a chained traceback (``raise ... from cause``) prints the cause first and the
    exception actually raised last."""
    if not type(err).__module__.startswith(("pyspark", "py4j")):
        return None
    found = _PY_EXCEPTION_LINE.findall(str(err))
    return found[-1] if found else None


def report(err: BaseException) -> None:
    """Print ``rlm: error: <message>`` on stderr, on one line (a failed Spark task: its executor's
    exception, not the JVM's stack; docs/spark-cluster.md)."""
    task_failure = spark_task_failure(err)
    if task_failure is not None:
        text = f"a Spark task failed: {task_failure}"
    elif isinstance(err, RlmError | OSError):
        text = str(err)
    else:
        text = f"{type(err).__name__}: {err}"
    click.echo(f"rlm: error: {' '.join(text.split())}", err=True)


def handle_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Decorate a click command so rlm, OS and unexpected errors exit cleanly with a message."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except click.exceptions.ClickException:
            raise
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as err:  # the CLI promise: one line, no traceback
            if os.environ.get("RLM_DEBUG"):
                raise
            report(err)
            raise SystemExit(exit_code_for(err)) from err

    return wrapper

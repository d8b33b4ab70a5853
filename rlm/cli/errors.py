"""How the CLI turns errors into exit codes and one-line messages (never a traceback).

Exit codes (DESIGN §4): 0 success; 1 a corrupt/unreadable input or a failed operation;
2 bad arguments or invalid configuration. ``RLM_DEBUG=1`` re-raises for a full traceback.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import click

from rlm.errors import BackendNotFoundError, ConfigError, InvalidArgumentError, RlmError

P = ParamSpec("P")
R = TypeVar("R")

EXIT_FAILURE = 1
EXIT_USAGE = 2


def exit_code_for(err: BaseException) -> int:
    """2 for configuration/argument errors (an unknown backend too), 1 for everything else."""
    usage = ConfigError | InvalidArgumentError | BackendNotFoundError
    return EXIT_USAGE if isinstance(err, usage) else EXIT_FAILURE


def report(err: BaseException) -> None:
    """Print ``rlm: error: <message>`` on stderr, on one line."""
    text = str(err) if isinstance(err, RlmError | OSError) else f"{type(err).__name__}: {err}"
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

"""What a test does when a real part it needs cannot run here (a server binary, Chromium, the
shared Kafka fixtures, a Java runtime): skip on a developer's machine, **fail in CI** (``CI`` set,
as .ci/run's environment has it). A suite never passes in CI by not running (the brief's rule)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["unavailable"]


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason`` outside CI; fail with it in CI."""
    if os.environ.get("CI"):
        pytest.fail(f"needed in CI, but: {reason}", pytrace=False)
    pytest.skip(reason)

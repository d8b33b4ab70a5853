"""Shared pytest fixtures: the real-broker Kafka fixtures of ../shared/fixtures (see its README)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.needs import unavailable

_REPO = Path(__file__).resolve().parent.parent


def locate_fixtures() -> Path | None:
    """``$RLM_FIXTURES`` if set, else ``<repo>/../shared/fixtures``; None when neither exists."""
    env = os.environ.get("RLM_FIXTURES")
    candidates = [Path(env)] if env else []
    candidates.append(_REPO.parent / "shared" / "fixtures")
    for path in candidates:
        if (path / "expected.json").is_file():
            return path
    return None


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """Directory holding ``kafka-logs/`` and ``expected.json``; absent: skips the test (fails in CI)."""
    path = locate_fixtures()
    if path is None:
        unavailable("no Kafka fixtures: set RLM_FIXTURES or put shared/fixtures beside the repo")
    return path


@pytest.fixture(scope="session")
def expected(fixtures_dir: Path) -> dict[str, Any]:
    """``expected.json``: per source dir, per partition dir, the answers for every segment."""
    data: dict[str, Any] = json.loads((fixtures_dir / "expected.json").read_text())
    return data


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test``: ``-n 2 --dist loadgroup``) the tests that share an
    expensive fixture run on one worker (tests/xdist_groups.py)."""
    if config.pluginmanager.hasplugin("xdist"):
        from tests.xdist_groups import XdistGroups

        config.pluginmanager.register(XdistGroups(), "rlm-xdist-groups")


# -- the real S3 server of every S3 suite: one SeaweedFS per session (or RLM_TEST_S3_ENDPOINT) ----

# Loaded here so every test package (storage, lookup, tiering, cluster, ops) can ask for them. The
# live Kafka brokers (tests/kafkaservers.py) are loaded by tests/live/conftest.py: only those suites
# use them, and the shared broker stops when they end instead of idling through the rest.
# -- the live HDFS of every HDFS suite: one MiniDFSCluster per session (or RLM_TEST_HDFS_URL) --------
from tests.hdfsservers import hdfs_server, hdfs_target  # noqa: E402,F401 - pytest fixtures
from tests.s3servers import s3_target, seaweed_server  # noqa: E402,F401 - pytest fixtures

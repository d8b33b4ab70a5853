"""The grouping rule of tests/xdist_groups.py holds in a real ``pytest -n 2 --dist loadgroup`` run
(CONTRIBUTING.md, "Running in parallel"): the tests sharing a module-scoped fixture, and those
carrying a ``NAMED_GROUPS`` marker, each run on one worker. Every test sleeps a little so the two
workers take units in turn: ungrouped, the tests of each group would be dealt to both."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.tiering.helpers import REPO

pytest.importorskip("xdist")

pytestmark = pytest.mark.integration

_CONFTEST = """
from tests.xdist_groups import XdistGroups

def pytest_configure(config):
    config.addinivalue_line("markers", "spark: a named group")
    config.pluginmanager.register(XdistGroups(), "rlm-xdist-groups")
"""

_TESTS = """
import os
import time
import pytest

@pytest.fixture(scope="module")
def shared():
    return os.environ["PYTEST_XDIST_WORKER"]

@pytest.mark.parametrize("i", range(6))
def test_shared(shared, i):
    time.sleep(0.1)
    assert shared == os.environ["PYTEST_XDIST_WORKER"]

@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    time.sleep(0.1)
"""

_SPARK = """
import time
import pytest

@pytest.mark.spark
@pytest.mark.parametrize("i", range(4))
def test_one(i):
    time.sleep(0.1)
"""


def _workers(out: str, name: str) -> set[str]:
    return set(re.findall(rf"\[(gw\d)\] \[ *\d+%\] PASSED \S*{name}", out))


def test_a_module_fixture_and_a_named_group_each_stay_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(_CONFTEST))
    (tmp_path / "test_mod.py").write_text(textwrap.dedent(_TESTS))
    (tmp_path / "test_spark_a.py").write_text(textwrap.dedent(_SPARK))
    (tmp_path / "test_spark_b.py").write_text(textwrap.dedent(_SPARK))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "20 passed" in out, out
    assert len(_workers(out, "test_mod.py::test_shared")) == 1, out
    assert len(_workers(out, "test_spark_")) == 1, out

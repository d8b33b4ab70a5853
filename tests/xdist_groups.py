"""Which tests must run on the same pytest-xdist worker (``make test`` runs ``-n 2 --dist loadgroup``;
CONTRIBUTING.md, "Running in parallel").

Under ``--dist loadgroup`` a test without an ``xdist_group`` mark is its own unit of work, sent to
whichever worker is free; tests sharing a group run on one worker, one after another. A fixture
broader than a function is set up once per worker that runs a test needing it, so a test joins the
group of the widest shared thing it uses:

1. a test marked with one of :data:`NAMED_GROUPS`'s markers joins that group — every Spark suite
   shares one local SparkSession and one standalone cluster (tests/spark/conftest.py), which two
   workers would start twice on 2 cores;
2. else a test using a ``package``-scoped fixture joins the package that defines it (tests/live's
   broker, tests/kafka's tiered daemon: one each, not one per worker);
3. else a test using a ``module``- or ``class``-scoped fixture joins its module's group (the
   module's daemon or data set is built once).

Session-scoped fixtures that are cheap to start (SeaweedFS, moto, the fixture paths) are not a
reason to group: each worker starts its own, on free ports under its own temp dir.

How the groups reach the scheduler: pytest-xdist's loadgroup appends ``@group`` to each worker's
node ids, and the controller splits them again; since pytest 9.2's structured node ids that rename
no longer takes (pytest-dev/pytest-xdist#1386: the marks are there, the tests are spread as if they
were not). So each worker also writes its ``{node id: group}`` map to a file the controller named
(:class:`XdistGroups`), and :class:`GroupScheduling` reads it, falling back to the ``@group``
suffix of an older pytest.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling

from rlm.fsutil import atomic_write

__all__ = ["NAMED_GROUPS", "GroupScheduling", "XdistGroups", "group_of"]

#: marker name -> the group every test carrying it joins.
NAMED_GROUPS = {"spark": "spark", "spark_cluster": "spark"}

_WIDTH = {"package": 2, "module": 1, "class": 1}
_INPUT_KEY = "rlm_xdist_groups"  # workerinput: where a worker writes its map


def group_of(item: pytest.Item) -> str | None:
    """The ``xdist_group`` name ``item`` must run in (see the module doc), or None when it may run
    on any worker alone."""
    for marker, group in NAMED_GROUPS.items():
        if item.get_closest_marker(marker) is not None:
            return group
    fixtureinfo = getattr(item, "_fixtureinfo", None)  # doctests and other non-function items
    if fixtureinfo is None:
        return None
    widest, where = 0, None
    for defs in fixtureinfo.name2fixturedefs.values():
        scope = defs[-1].scope  # the definition that applies to this item (the closest override)
        width = _WIDTH.get(scope, 0)
        if width > widest:
            widest = width
            # a package fixture lives once per package that defines it (its conftest's directory)
            where = defs[-1].baseid if scope == "package" else item.nodeid.split("::", 1)[0]
    return where


def _mark_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add ``xdist_group(name=...)`` to every item that must share a worker; in an xdist worker,
    also write the map for :class:`GroupScheduling`."""
    groups: dict[str, str] = {}
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(name=group))
            groups[item.nodeid] = group
    target = getattr(config, "workerinput", {}).get(_INPUT_KEY)
    if target is not None:
        atomic_write(target, json.dumps(groups).encode(), durable=False)


class GroupScheduling(LoadGroupScheduling):
    """xdist's loadgroup with the groups the workers wrote to ``maps`` (the module doc)."""

    def __init__(self, config: pytest.Config, log: Any, maps: Path) -> None:
        super().__init__(config, log)
        self._maps = maps
        self._groups: dict[str, str] = {}

    def schedule(self) -> None:
        if self.collection is None:  # the first call: every worker has collected (and written)
            for path in sorted(self._maps.glob("*.json")):
                self._groups.update(json.loads(path.read_text()))
        super().schedule()

    def _split_scope(self, nodeid: str) -> str:
        group = self._groups.get(nodeid)
        return group if group is not None else super()._split_scope(nodeid)


class XdistGroups:
    """The plugin (registered by tests/conftest.py when pytest-xdist is installed): in each worker
    it marks the groups; in the controller it names each worker's map file and schedules with them."""

    def __init__(self) -> None:
        self._maps: Path | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        # First: before xdist's worker reads the marks, after tests/spark/conftest.py (also first,
        # registered later, so called earlier) has marked its tests ``spark``.
        _mark_groups(config, items)

    def _dir(self) -> Path:
        if self._maps is None:
            self._maps = Path(tempfile.mkdtemp(prefix="rlm-xdist-groups-"))
        return self._maps

    @pytest.hookimpl
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[_INPUT_KEY] = str(self._dir() / f"{node.gateway.id}.json")

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> GroupScheduling | None:
        if config.getvalue("dist") != "loadgroup":
            return None
        return GroupScheduling(config, log, self._dir())

    def pytest_unconfigure(self) -> None:
        if self._maps is not None:
            shutil.rmtree(self._maps, ignore_errors=True)

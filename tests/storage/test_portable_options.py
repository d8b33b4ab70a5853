"""What a job ships to Spark executors: backend options that name paths of this host, already
resolved (executors run in other working directories), and the driver's rlm build, which executors
check (docs/spark-cluster.md)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from rlm.config import settings_from_mapping
from rlm.jobs.reading.plan import BackendSpec
from rlm.storage.fsspec_backend import FsspecBackend
from rlm.storage.local import LocalBackend


def test_a_relative_local_root_is_absolute_and_normalised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    backend = LocalBackend.from_options({"root": "../store"})
    assert backend.options["root"] == str(tmp_path / "store")
    # The same directory spelt two ways names its objects with the same URLs (RDIs hold them).
    assert backend.url("k") == LocalBackend.from_options({"root": str(tmp_path / "store")}).url("k")
    monkeypatch.chdir(tmp_path)  # an executor's working directory
    copy = pickle.loads(pickle.dumps(backend))
    assert copy.root == tmp_path / "store" and copy.url("k") == backend.url("k")


def test_fsspec_local_roots_are_resolved_remote_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert FsspecBackend.portable_options({"protocol": "file", "root": "x/../y"})["root"] == os.path.join(
        str(tmp_path), "y"
    )
    assert FsspecBackend.portable_options({"protocol": "memory", "root": "x"})["root"] == "x"


def test_the_spec_shipped_to_executors_names_the_drivers_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = settings_from_mapping(
        {
            "log": {"dirs": [str(tmp_path / "logs")]},
            "remote": {"backend": "local", "options": {"root": "store"}},
        }
    )
    spec = BackendSpec.from_settings(settings)
    assert spec.options["root"] == str(tmp_path / "store")
    monkeypatch.chdir("/")
    assert spec.create().url("k") == (tmp_path / "store" / "k").as_uri()


def test_an_executor_with_another_rlm_refuses_the_drivers_tasks(tmp_path: Path) -> None:
    from rlm.errors import ExecutorEnvironmentError
    from rlm.jobs.reading.ship import rlm_build

    settings = settings_from_mapping(
        {"log": {"dirs": [str(tmp_path / "logs")]}, "remote": {"backend": "memory", "options": {}}}
    )
    spec = BackendSpec.from_settings(settings)
    assert spec.build == rlm_build() and spec.build.count("+") == 1
    spec.create()  # the same build: fine
    other = BackendSpec(spec.name, spec.options, spec.build.partition("+")[0] + "+0123456789abcdef")
    with pytest.raises(ExecutorEnvironmentError, match=r"runs rlm .* the driver rlm .*\+0123456789abcdef"):
        other.create()
    BackendSpec(spec.name, spec.options).create()  # not stamped (built by hand): no check

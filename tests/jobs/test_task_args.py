"""What a Spark task receives is plain picklable data: the executor-side functions of the jobs
(`verify` stages 1 and 2, the `rebuild_index` fetch, bulk `offsets_for_times`) run in a freshly
spawned interpreter — their arguments and results pickled across, as Spark ships them — and
answer exactly what they answer in the driver's process. A store travels as a `BackendSpec`; no
client, connection or cache of the driver does."""

from __future__ import annotations

import multiprocessing
import pickle
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.config import Settings, load_settings
from rlm.jobs.checks.verify_deep import deep_check_segment
from rlm.jobs.checks.verify_store import scrub_partition
from rlm.jobs.index import OffsetRow, _fetch_partition, _lookup_partitions
from rlm.jobs.reading.plan import BackendSpec
from rlm.storage.registry import create_backend
from rlm.testing.configs import write_config
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.store.remote_state import RemoteState

TOPIC = "args"


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """``args-0`` generated and tiered into a local-folder store by the real daemon pass."""
    root = tmp_path_factory.mktemp("task-args")
    logs = root / "logs"
    generate_log_dir(logs, [(TOPIC, 1)], seed=5, records=300, segment_bytes=8 * 1024)
    cfg = write_config(root / "c.toml", [logs], root=root / "store", index_entry_bytes=2048)
    settings = load_settings(cfg)
    backend = create_backend(settings.remote.backend, settings.remote.options)
    result = RemoteLogManager(settings, backend).run_once()[0]
    assert result.error is None and len(result.copied) >= 2
    return settings


@pytest.fixture(scope="module")
def executor() -> Iterator[ProcessPoolExecutor]:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


def test_a_backend_spec_is_plain_data(settings: Settings) -> None:
    spec = BackendSpec.from_settings(settings)
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert spec.name == "local" and Path(spec.options["root"]).is_absolute()


def test_verify_stage_one_in_a_spawned_process(settings: Settings, executor: ProcessPoolExecutor) -> None:
    spec = BackendSpec.from_settings(settings)
    args = (spec, TOPIC, 0, 60_000, 2_000_000_000_000, None)
    there = executor.submit(scrub_partition, *args).result()
    here = scrub_partition(*args)
    assert there == here
    assert here.problems == [] and len(here.manifests) >= 2 and len(here.entries) == len(here.manifests)


def test_verify_stage_two_in_a_spawned_process(settings: Settings, executor: ProcessPoolExecutor) -> None:
    spec = BackendSpec.from_settings(settings)
    facts = scrub_partition(spec, TOPIC, 0, 60_000, 2_000_000_000_000, None)
    doc = facts.manifests[0]
    base = RemoteState(spec.create(), TOPIC, 0).list_manifests()[0].base_offset
    blob = facts.entries[base]
    problems, read, batches = executor.submit(deep_check_segment, spec, doc, blob).result()
    assert (problems, read, batches) == deep_check_segment(spec, doc, blob)
    assert problems == [] and read > 0 and batches > 0


def test_rebuild_index_fetch_in_a_spawned_process(settings: Settings, executor: ProcessPoolExecutor) -> None:
    spec = BackendSpec.from_settings(settings)
    there = executor.submit(_fetch_partition, spec, TOPIC, 0, None).result()
    assert there == _fetch_partition(spec, TOPIC, 0, None)
    manifests = RemoteState(spec.create(), TOPIC, 0).list_manifests()
    assert [first for _, first, _ in there[2]] == [m.base_offset for m in manifests]


def _offsets(settings: Settings, spec: BackendSpec, target: int) -> list[OffsetRow]:
    return list(_lookup_partitions(settings, spec, target, iter([(TOPIC, 0)])))


def test_offsets_for_times_in_a_spawned_process(settings: Settings, executor: ProcessPoolExecutor) -> None:
    """The settings travel too (lookups read the local log dirs, so executors run on the sidecar
    host): a pickled copy answers the driver's rows, for a time inside the history and the
    earliest/latest special values."""
    spec = BackendSpec.from_settings(settings)
    assert pickle.loads(pickle.dumps(settings)) == settings
    for target in (0, -2, -1):
        there = executor.submit(_offsets, settings, spec, target).result()
        assert there == _offsets(settings, spec, target)
        assert there[0][:2] == (TOPIC, 0) and there[0][2] >= 0

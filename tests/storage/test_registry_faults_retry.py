"""Registry, option validation, the retry policy and the fault-injecting wrapper."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import pytest

from rlm.errors import BackendNotFoundError, ConfigError, ObjectExistsError, TransientStorageError
from rlm.storage import backend_from_config, create_backend, installed_backends
from rlm.storage.faults import FaultyBackend
from rlm.storage.memory import MemoryBackend
from rlm.storage.options import Option, parse_options
from rlm.storage.retry import RetryingBackend, RetryPolicy, put_if_absent_idempotent


def no_sleep(_: float) -> None:
    pass


def test_registry_resolves_entry_points() -> None:
    assert {"local", "memory", "faulty"} <= set(installed_backends())
    assert isinstance(create_backend("memory"), MemoryBackend)
    b = backend_from_config({"backend": "faulty", "options": {"inner": "memory", "seed": 3}})
    # One retry layer, outermost; the faulty wrapper's inner store is built without one.
    assert isinstance(b, RetryingBackend) and isinstance(b.inner, FaultyBackend)
    assert isinstance(b.inner.inner, MemoryBackend)


def test_unknown_backend_lists_installed_and_hints_install() -> None:
    with pytest.raises(BackendNotFoundError) as e:
        create_backend("gcs")
    assert "installed: faulty" in str(e.value) and "local" in str(e.value)
    from rlm.storage import registry

    real = registry.installed_backends
    try:
        registry.installed_backends = lambda: {}  # type: ignore[assignment]
        with pytest.raises(BackendNotFoundError, match=r"pip install \./plugins/rlm-storage-s3"):
            create_backend("s3")
    finally:
        registry.installed_backends = real  # type: ignore[assignment]


def test_config_errors_name_key_and_allowed() -> None:
    with pytest.raises(ConfigError, match=r"unknown option.*'rot'.*allowed: create, direct_io, fsync, root"):
        create_backend("local", {"rot": "/x"})
    with pytest.raises(ConfigError, match=r"remote\.options\.root is required"):
        create_backend("local", {})
    with pytest.raises(ConfigError, match="unknown key"):
        backend_from_config({"backend": "memory", "extra": 1})
    with pytest.raises(ConfigError, match="backend is required"):
        backend_from_config({})
    with pytest.raises(ConfigError, match=r"throttle_rate = 2\.0"):
        create_backend("faulty", {"throttle_rate": 2})
    with pytest.raises(ConfigError, match="add up to"):
        create_backend("faulty", {"throttle_rate": 0.6, "error_rate": 0.6})


def test_option_kinds_and_secret_values_never_echoed() -> None:
    spec = (
        Option("n", "int"),
        Option("s", "size"),
        Option("b", "bool"),
        Option("k", "str", secret=True, choices=("a",)),
    )
    assert parse_options("x", {"n": "7", "s": "8MiB", "b": "yes"}, spec) == {
        "n": 7,
        "s": 8 << 20,
        "b": True,
        "k": None,
    }
    with pytest.raises(ConfigError) as e:
        parse_options("x", {"k": "hunter2-secret"}, spec)
    assert "hunter2" not in str(e.value) and "***" in str(e.value)


def test_retry_policy_full_jitter_and_give_up() -> None:
    delays: list[float] = []
    policy = RetryPolicy(
        max_attempts=5, base_delay=1.0, max_delay=4.0, sleep=delays.append, rng=random.Random(1)
    )
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 5:
            raise TransientStorageError("503 SlowDown")
        return "ok"

    assert policy.call(flaky) == "ok"
    assert len(delays) == 4
    assert all(0 <= d <= cap for d, cap in zip(delays, [1, 2, 4, 4], strict=True))
    calls.clear()
    with pytest.raises(TransientStorageError):
        RetryPolicy(max_attempts=3, sleep=no_sleep).call(lambda: flaky() and None)
    assert len(calls) == 3
    with pytest.raises(ValueError):  # not transient: no retry
        policy.call(lambda: int("x"))
    assert pickle.loads(pickle.dumps(RetryPolicy())).max_attempts == 6


def test_faults_are_deterministic_by_seed() -> None:
    def run(seed: int) -> list[str]:
        f = FaultyBackend.wrap(MemoryBackend(), seed=seed, throttle_rate=0.3, error_rate=0.2)
        out = []
        for i in range(40):
            try:
                f.put(f"k{i}", b"x")
                out.append("ok")
            except TransientStorageError as e:
                out.append(str(e))
        return out

    assert run(5) == run(5)
    assert run(5) != run(6)
    assert any("503 SlowDown" in r for r in run(5)) and any("500" in r for r in run(5))


def test_retries_recover_from_throttling_and_5xx_over_memory() -> None:
    faulty = FaultyBackend.wrap(MemoryBackend(), seed=1, throttle_rate=0.3, error_rate=0.2, timeout_rate=0.1)
    b = RetryingBackend(faulty, RetryPolicy(max_attempts=40, sleep=no_sleep))
    for i in range(50):
        b.put(f"seg/{i:03d}", bytes([i]) * 100)
    assert [o.key for o in b.list("seg/")] == [f"seg/{i:03d}" for i in range(50)]
    assert all(b.read(f"seg/{i:03d}") == bytes([i]) * 100 for i in range(50))
    inj = faulty.injected
    assert inj["throttle"] > 10 and inj["error"] > 5 and inj["timeout"] > 0


def test_lost_ack_on_conditional_create_is_never_a_duplicate() -> None:
    inner = MemoryBackend()
    faulty = FaultyBackend.wrap(inner, lost_ack_rate=1.0, max_faults=1)
    with pytest.raises(TransientStorageError, match="lost ack"):
        faulty.put("m1", b"A", if_absent=True)
    assert inner.read("m1") == b"A"  # the write happened although the client saw an error
    with pytest.raises(ObjectExistsError):  # a naive retry sees its own write as a conflict
        faulty.put("m1", b"A", if_absent=True)
    faulty2 = FaultyBackend.wrap(inner, lost_ack_rate=1.0, max_faults=1)
    info = put_if_absent_idempotent(faulty2, "m2", b"manifest", RetryPolicy(sleep=no_sleep))
    assert info.size == 8 and faulty2.injected["lost_ack"] == 1
    assert [o.key for o in inner.list()] == ["m1", "m2"]
    with pytest.raises(ObjectExistsError):  # someone else's content is still a conflict
        put_if_absent_idempotent(faulty2, "m2", b"other", RetryPolicy(sleep=no_sleep))
    rb = RetryingBackend(
        FaultyBackend.wrap(inner, lost_ack_rate=1.0, max_faults=1), RetryPolicy(sleep=no_sleep)
    )
    rb.put("m3", b"z", if_absent=True)
    assert inner.read("m3") == b"z"


def test_partial_upload_never_publishes() -> None:
    inner = MemoryBackend()
    f = FaultyBackend.wrap(inner, partial_upload_rate=1.0)
    with pytest.raises(TransientStorageError, match="partial upload"):
        f.put("seg.log", b"x" * 200_000)
    assert not inner.exists("seg.log") and list(inner.list()) == []
    assert f.injected["partial_upload"] == 1


def test_listing_lag_hides_new_keys_for_n_operations() -> None:
    f = FaultyBackend.wrap(MemoryBackend(), list_lag_ops=3)
    assert f.capabilities.consistent_listing is False
    f.put("a", b"1")
    assert [o.key for o in f.list()] == []  # 1 op later
    assert f.exists("a")  # reads are consistent; only listings lag
    assert [o.key for o in f.list()] == ["a"]


def test_latency_and_operation_filter() -> None:
    slept: list[float] = []
    f = FaultyBackend.wrap(
        MemoryBackend(), sleep=slept.append, latency_ms=20, error_rate=1.0, operations=["delete"]
    )
    f.put("a", b"1")
    assert f.read("a") == b"1"
    with pytest.raises(TransientStorageError):
        f.delete("a")
    assert slept == [0.02, 0.02, 0.02]


def test_faulty_from_config_describes_inner_and_pickles(tmp_path: Path) -> None:
    b = create_backend(
        "faulty", {"inner": "local", "inner_options": {"root": str(tmp_path)}, "error_rate": 0.1}
    )
    assert b.describe()["options"]["inner_options"]["root"] == str(tmp_path)
    clone = pickle.loads(pickle.dumps(b))
    assert clone.describe() == b.describe()


def test_wrappers_name_objects_by_the_inner_stores_urls(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from rlm.storage.faults import FaultyBackend
    from rlm.storage.local import LocalBackend
    from rlm.storage.retry import RetryingBackend

    inner = LocalBackend(root=str(tmp_path))
    faulty = FaultyBackend.from_options({"inner": "local", "inner_options": {"root": str(tmp_path)}})
    for wrapper in (faulty, RetryingBackend(inner)):
        url = wrapper.url("t-0/data/x/segment.log")
        assert url == inner.url("t-0/data/x/segment.log") and url.startswith("file://")
        assert wrapper.key_for_url(url) == inner.key_for_url(url) == "t-0/data/x/segment.log"


def test_a_plugin_with_the_old_retry_hook_name_still_gets_the_policy() -> None:
    """The hook was ``adopt_retry_policy`` before #32's renames; a third-party backend overriding
    that name must still receive the retry layer's policy (and be told the new name)."""
    got: list[RetryPolicy] = []

    class OldPlugin(MemoryBackend):
        def adopt_retry_policy(self, policy: RetryPolicy) -> None:
            got.append(policy)

    with pytest.warns(DeprecationWarning, match="use_retry_policy"):
        wrapped = RetryingBackend(OldPlugin())
    assert got == [wrapped.policy]
    RetryingBackend(MemoryBackend())  # the default hook: nothing to call, no warning (filterwarnings=error)

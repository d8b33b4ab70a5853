"""The key prefix spread (rlm/storage/spread.py, docs/key-spread.md): the conformance suite through
the mapping, the physical keys it writes, listings across buckets against an unspread oracle, URLs,
and the store's recorded layout — on the real local and memory backends."""

from __future__ import annotations

import hashlib
import json
import pickle
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlm.errors import ConfigError, FormatError, StoreLayoutError
from rlm.storage import backend_from_config
from rlm.storage.api import StorageBackend
from rlm.storage.faults import FaultyBackend
from rlm.storage.local import LocalBackend
from rlm.storage.memory import MemoryBackend
from rlm.storage.registry import open_backend
from rlm.storage.retry import RetryingBackend
from rlm.storage.spread import LAYOUT_KEY, SpreadBackend, open_spread
from rlm.testing.backend_suite import BackendSuite
from rlm.testing.counting import CountingBackend


def sha_prefix(name: str, digits: int) -> str:
    """The bucket as docs/key-spread.md defines it, computed here independently."""
    return hashlib.sha256(name.encode()).hexdigest()[:digits]


class TestSpreadLocal(BackendSuite):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[StorageBackend]:
        with open_spread(LocalBackend(root=str(tmp_path / "store")), 2) as b:
            yield b


class TestSpreadMemoryOneDigit(BackendSuite):
    picklable = False  # a private memory store is empty after unpickling

    @pytest.fixture
    def backend(self) -> Iterator[StorageBackend]:
        with open_spread(MemoryBackend(), 1) as b:
            yield b


def _files(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and not str(p.relative_to(root)).startswith(".rlm-")
    )


def test_keys_are_stored_under_the_hash_of_the_partition_name(tmp_path: Path) -> None:
    root = tmp_path / "store"
    spread = open_spread(LocalBackend(root=str(root)), 3)
    logical = [
        "orders-3/manifests/00000000000000000000.json",
        "orders-3=AAECAwQFBgcICQoLDA0ODw/data/x/segment.log",
        "pay.ments-12=AAECAwQFBgcICQoLDA0ODw/owner.json",
    ]
    for key in logical:
        assert spread.put(key, key.encode()).key == key
    expected = sorted([LAYOUT_KEY] + [f"{sha_prefix(k.split('/')[0].split('=')[0], 3)}/{k}" for k in logical])
    assert _files(root) == expected
    # Both incarnations of orders-3 share one bucket: one listing of it finds both roots.
    assert expected[1].split("/")[0] == expected[2].split("/")[0] == sha_prefix("orders-3", 3)
    assert [o.key for o in spread.list("orders-3")] == sorted(logical[:2])
    assert [o.key for o in spread.list("orders-3=")] == [logical[1]]
    assert json.loads((root / LAYOUT_KEY).read_bytes()) == {
        "format": "rlm-layout",
        "version": 1,
        "prefix_spread": 3,
        "hash": "sha256",
    }
    for key in logical:
        assert spread.read(key) == key.encode() and spread.head(key).key == key
        url = spread.url(key)
        bucket = sha_prefix(key.split("/")[0].split("=")[0], 3)
        assert url == LocalBackend(root=str(root)).url(f"{bucket}/{key}")
        assert spread.key_for_url(url) == key
    wrong = "fff" if sha_prefix("orders-3", 3) != "fff" else "000"
    with pytest.raises(ValueError, match="hash prefix"):
        spread.key_for_url(LocalBackend(root=str(root)).url(f"{wrong}/orders-3/x"))


@pytest.mark.parametrize("digits", [1, 2])
def test_listings_across_buckets_match_an_unspread_store(digits: int) -> None:
    rng = random.Random(digits)
    oracle, spread = MemoryBackend(), open_spread(MemoryBackend(), digits)
    names = [
        f"t{rng.randrange(40)}-{rng.randrange(12)}" + rng.choice(["", "=AAECAwQFBgcICQoLDA0ODw"])
        for _ in range(60)
    ]
    keys = {f"{n}/{rng.choice(['manifests', 'data'])}/{i:05d}" for i, n in enumerate(names)}
    for key in keys:
        oracle.put(key, b"x")
        spread.put(key, b"x")
    for prefix in ["", "t", "t1", "t1-", "t3-1", "t3-1/", "t3-1=", "zz"]:
        want = [o.key for o in oracle.list(prefix)]
        assert [o.key for o in spread.list(prefix)] == want, prefix
        assert [o.key for o in spread.list(prefix, page_size=7)] == want, prefix
        # Page by page with tokens, and resumed after arbitrary keys (the token contract).
        paged, token = [], None
        while True:
            page = spread.list_page(prefix, token=token, limit=5)
            paged += page.keys
            if page.next_token is None:
                break
            token = page.next_token
        assert paged == want, prefix
        for after in rng.sample(sorted(keys), 5):
            assert (
                spread.list_page(prefix, token=after, limit=4).keys
                == oracle.list_page(prefix, token=after, limit=4).keys
            ), (prefix, after)


def test_merged_listing_costs_one_list_per_bucket_and_a_partition_listing_one() -> None:
    counting = CountingBackend(MemoryBackend())
    spread = open_spread(counting, 2)
    spread.put("a-0/x", b"1")
    counting.calls.clear()
    assert [o.key for o in spread.list("a-0/")] == ["a-0/x"]
    assert counting.calls == {"list": 1}
    counting.calls.clear()
    assert [o.key for o in spread.list("")] == ["a-0/x"]
    assert counting.calls == {"list": 256}


def test_layout_is_recorded_and_a_mismatch_refused_with_both_values(tmp_path: Path) -> None:
    root = tmp_path / "store"
    open_spread(LocalBackend(root=str(root)), 2).put("t-0/k", b"v")
    for other in (0, 1, 4):
        with pytest.raises(StoreLayoutError) as err:
            open_spread(LocalBackend(root=str(root)), other)
        text = str(err.value)
        assert "\n" not in text and isinstance(err.value, ConfigError)
        assert f"remote.prefix_spread = {other} does not match" in text
        assert "records prefix_spread = 2" in text and str(root / LAYOUT_KEY) in text
    assert open_spread(LocalBackend(root=str(root)), 2).read("t-0/k") == b"v"


def test_an_unspread_store_with_data_is_spread_zero(tmp_path: Path) -> None:
    root = tmp_path / "store"
    plain = open_spread(LocalBackend(root=str(root)), 0)
    assert isinstance(plain, LocalBackend)  # spread 0 on a checked store: no wrapper at all
    plain.put("t-0/manifests/a.json", b"{}")
    with pytest.raises(
        StoreLayoutError,
        match=r"holds objects \(t-0/manifests/a.json\) but no "
        r"rlm-layout.json, i.e. prefix_spread = 0",
    ):
        open_spread(LocalBackend(root=str(root)), 2)
    assert _files(root) == ["t-0/manifests/a.json"]  # nothing written by the refused open
    # An empty store used with spread 0 stays as it was: no layout object.
    empty = tmp_path / "empty"
    open_spread(LocalBackend(root=str(empty)), 0).put("t-1/k", b"")
    assert _files(empty) == ["t-1/k"]


def test_racing_first_opens_agree_or_refuse() -> None:
    ns = "spread-race"
    first = open_spread(MemoryBackend(namespace=ns), 2)
    second = open_spread(MemoryBackend(namespace=ns), 2)  # sees the layout the first one wrote
    first.put("a-1/k", b"1")
    assert second.read("a-1/k") == b"1"
    # The loser of the create-only PUT re-reads the winner's layout and refuses a different one.
    inner = MemoryBackend(namespace="spread-race-2")
    inner.put(
        LAYOUT_KEY,
        json.dumps({"format": "rlm-layout", "version": 1, "prefix_spread": 1, "hash": "sha256"}).encode(),
    )
    with pytest.raises(StoreLayoutError, match="records prefix_spread = 1"):
        SpreadBackend(inner, 3).put("a-1/k", b"1")


def test_malformed_layout_object_names_itself() -> None:
    inner = MemoryBackend()
    inner.put(LAYOUT_KEY, b'{"format": "rlm-layout", "version": 2, "prefix_spread": 1, "hash": "sha256"}')
    with pytest.raises(FormatError, match=r"rlm-layout\.json: layout version 2"):
        open_spread(inner, 1)
    inner.put(LAYOUT_KEY, b"not json")
    with pytest.raises(FormatError, match=r"rlm-layout\.json: malformed layout object"):
        open_spread(inner, 0)


def test_a_store_that_does_not_answer_at_open_is_checked_on_its_first_call() -> None:
    inner = MemoryBackend(namespace="spread-late")
    inner.put(
        LAYOUT_KEY,
        json.dumps({"format": "rlm-layout", "version": 1, "prefix_spread": 2, "hash": "sha256"}).encode(),
    )
    # The first store call fails transiently (the fault injector's 5xx), later ones answer.
    flaky = FaultyBackend.from_options(
        {"inner": "memory", "inner_options": {"namespace": "spread-late"}, "error_rate": 1.0, "max_faults": 1}
    )
    store = open_spread(flaky, 1)
    assert isinstance(store, SpreadBackend)
    with pytest.raises(StoreLayoutError, match="records prefix_spread = 2"):
        store.put("a-0/k", b"v")
    assert not inner.exists(f"{sha_prefix('a-0', 1)}/a-0/k")


def test_pickled_spread_backend_maps_the_same_keys(tmp_path: Path) -> None:
    spread = open_spread(LocalBackend(root=str(tmp_path / "s")), 2)
    spread.put("x-0/k", b"v")
    clone = pickle.loads(pickle.dumps(spread))
    assert isinstance(clone, SpreadBackend) and clone.digits == 2
    assert clone.read("x-0/k") == b"v" and clone.url("x-0/k") == spread.url("x-0/k")


def test_config_table_and_open_backend(tmp_path: Path) -> None:
    opts = {"root": str(tmp_path / "s")}
    built = backend_from_config({"backend": "local", "options": opts, "prefix_spread": 2})
    assert isinstance(built, RetryingBackend) and isinstance(built.inner, SpreadBackend)
    assert built.inner.describe()["options"] == {"prefix_spread": 2}
    built.put("q-0/k", b"v")
    assert open_backend("local", opts, 2).read("q-0/k") == b"v"
    with pytest.raises(StoreLayoutError):
        open_backend("local", opts, 0)
    for bad in (5, -1, "2", True):
        with pytest.raises(ConfigError, match=r"remote\.prefix_spread"):
            backend_from_config({"backend": "local", "options": opts, "prefix_spread": bad})


def test_a_store_slower_than_the_wait_is_checked_in_the_background() -> None:
    slow = FaultyBackend.from_options(
        {"inner": "memory", "inner_options": {"namespace": "spread-slow"}, "latency_ms": 300.0}
    )
    store = open_spread(slow, 0, wait_s=0.01)
    assert isinstance(store, SpreadBackend)  # not checked yet: a guard, not the bare backend
    store.put("a-0/k", b"v")  # waits for the check, then writes unmapped (spread 0)
    assert MemoryBackend(namespace="spread-slow").read("a-0/k") == b"v"
    mismatch = open_spread(slow, 2, wait_s=0.01)
    with pytest.raises(StoreLayoutError, match=r"holds objects \(a-0/k\)"):
        mismatch.read("a-0/k")
    with pytest.raises(StoreLayoutError):  # remembered: no second check
        mismatch.head("a-0/k")


def test_paging_a_merged_listing_continues_one_merge() -> None:
    counting = CountingBackend(MemoryBackend())
    spread = open_spread(counting, 1)
    keys = [f"p{i}-{j}/k{n}" for i in range(9) for j in range(3) for n in range(2)]
    for key in keys:
        spread.put(key, b"")
    counting.calls.clear()
    paged, token = [], None
    while True:  # as a wrapper above (metering, health) pages: list_page after list_page
        page = spread.list_page("", token=token, limit=5)
        paged += page.keys
        if page.next_token is None:
            break
        token = page.next_token
    assert paged == sorted(keys)
    per_bucket: dict[str, int] = {}
    for key in keys:
        b = sha_prefix(key.split("/")[0], 1)
        per_bucket[b] = per_bucket.get(b, 0) + 1
    # One listing per bucket and page of 5 of it (a page of fewer than 5 is the last), never
    # 16 listings again for each of the 11 pages.
    assert counting.calls["list"] == sum(max(1, -(-per_bucket.get(f"{i:x}", 0) // 5)) for i in range(16))


def test_a_mismatch_found_late_is_a_refusal_the_health_probe_survives() -> None:
    from rlm.errors import StorageError
    from rlm.storage.health import HealthTrackingBackend, StoreHealth

    inner = MemoryBackend(namespace="spread-probe")
    inner.put(
        LAYOUT_KEY,
        json.dumps({"format": "rlm-layout", "version": 1, "prefix_spread": 1, "hash": "sha256"}).encode(),
    )
    health = StoreHealth(probe_interval_ms=0)
    tracked = HealthTrackingBackend(SpreadBackend(inner, 2), health)  # not checked at open
    assert tracked.probe() is True  # the store answered (with a refusal): reachable, no exception
    with pytest.raises(StoreLayoutError) as err:
        tracked.read("a-0/k")
    assert isinstance(err.value, ConfigError) and isinstance(err.value, StorageError)
    assert health.unreachable_since() is None


def test_a_stray_stored_key_under_a_wrong_hash_prefix_is_not_listed() -> None:
    inner = MemoryBackend()
    spread = open_spread(inner, 1)
    spread.put("a-0/k", b"1")
    wrong = next(f"{i:x}" for i in range(16) if f"{i:x}" != sha_prefix("b-0", 1))
    inner.put(f"{wrong}/b-0/k", b"foreign")  # not where spread 1 puts b-0's keys
    assert [o.key for o in spread.list("")] == ["a-0/k"]
    assert spread.list_page("", limit=5).keys == ["a-0/k"]
    assert list(spread.list("b-0/")) == []

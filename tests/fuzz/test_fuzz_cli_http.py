"""Fuzz the two outer surfaces: ``rlm dump`` on mutated files (a real subprocess) and every HTTP
route's parameters (a real uvicorn server over a tiered log dir: tests/http/test_api.py's fixture).

``rlm dump``: exit 0, or exit 1 with exactly one stderr line that names the file; never a
traceback. HTTP: every answer is 2xx or 4xx, JSON unless it is a raw record fetch; never a 5xx.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlm.formats.checkpoint import EpochEntry, format_leader_epoch_checkpoint, format_offset_checkpoint
from rlm.formats.indexes.txn_index import AbortedTxn, encode_txn_index
from rlm.testing.daemon import rlm_cli
from tests.fuzz.harness import INTERESTING, fuzz_settings, mutated
from tests.fuzz.seeds import record_seeds, writer_segment
from tests.fuzz.test_fuzz_indexes import fix_entry_crcs, kafka_index_seeds, remote_set
from tests.http.test_api import TOKEN, Api, api  # noqa: F401  (the module-scoped server fixture)
from tests.tiering.txn_helpers import snapshot_bytes

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def dump_seeds() -> dict[str, bytes]:
    """File name (Kafka's naming decides how dump reads it) -> valid content."""
    log_index, offset_index, time_index = remote_set()
    seeds = {
        "00000000000000000000.log": writer_segment(),
        "00000000000000000100.log": record_seeds()["v1-gzip"] + record_seeds()["v2-control"],
        "00000000000000000000-0000000001.checkpoint": record_seeds()["v2-zstd"],
        "00000000000000001000.index": kafka_index_seeds()["built.index"][1],
        "00000000000000001000.timeindex": kafka_index_seeds()["built.timeindex"][1],
        "00000000000000001000.txnindex": encode_txn_index([AbortedTxn(990, 1004, 7, 1005)]),
        "00000000000000001000.snapshot": snapshot_bytes({7: 990, 9: 998}),
        "00000000000000001000.remotelogindex": log_index,
        "00000000000000001000.remoteoffsetindex": offset_index,
        "00000000000000001000.remotetimeindex": time_index,
        "replication-offset-checkpoint": format_offset_checkpoint({("orders", 0): 12}).encode(),
        "leader-epoch-checkpoint": format_leader_epoch_checkpoint(
            [EpochEntry(0, 0), EpochEntry(2, 9)]
        ).encode(),
    }
    return seeds


@st.composite
def dump_cases(draw: st.DrawFn) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(dump_seeds())))
    seed = dump_seeds()[name]
    data = draw(mutated(seed).map(fix_entry_crcs) if name.endswith(".remotelogindex") else mutated(seed))
    return name, data


@pytest.mark.integration
@fuzz_settings(0.15, cap=250)  # a subprocess each: ~0.5 s
@given(dump_cases())
def test_rlm_dump_on_mutated_files(case: tuple[str, bytes]) -> None:
    name, data = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        proc = rlm_cli("dump", "--records", path, timeout=60, cwd=REPO)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 1), (proc.returncode, proc.stderr)
    if proc.returncode == 0:
        assert proc.stderr == ""
    else:
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"rlm: error: {path}: "), proc.stderr
    for line in proc.stdout.splitlines():  # what was readable is still printed as JSON
        assert json.loads(line)["file"] == str(path)


# --- HTTP ------------------------------------------------------------------------------------------

_TOPICS = st.sampled_from(
    ("orders", "audit.events_v2", "nope", ".", "..", "a" * 250, "or%ders", "ordérs", "")
)
_NUMBERS = st.sampled_from(INTERESTING) | st.integers(-(2**70), 2**70) | st.sampled_from((-1, -2, -3, -4, -5))
_PARAM = _NUMBERS.map(str) | st.text(max_size=12) | st.sampled_from(("1e3", "0x10", " 1", "1.5", "NaN", "-0"))


def _segment(value: str) -> str:
    return quote(value, safe="") or "%20"


@st.composite
def get_requests(draw: st.DrawFn) -> tuple[str, dict[str, str]]:
    topic = _segment(draw(_TOPICS | st.text(max_size=20)))
    partition = _segment(draw(st.sampled_from(("0", "1", "3")) | _PARAM))
    route = draw(st.sampled_from(("offsets", "timestamps", "records")))
    if route == "records":
        params = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "offset": _PARAM,
                    "max_bytes": _PARAM | st.sampled_from(("1", "67108864", "67108865")),
                    "format": st.sampled_from(("raw", "json", "xml", "")) | st.text(max_size=5),
                },
            )
        )
        return f"/v1/topics/{topic}/partitions/{partition}/records", params
    return f"/v1/topics/{topic}/partitions/{partition}/{route}/{_segment(draw(_PARAM))}", {}


def _assert_answer(resp: httpx.Response, *, raw_ok: bool) -> None:
    assert 200 <= resp.status_code < 500, (resp.status_code, resp.text[:300])
    kind = resp.headers.get("content-type", "")
    if resp.status_code == 200 and raw_ok and kind.startswith("application/octet-stream"):
        return
    assert kind.startswith("application/json"), (resp.status_code, kind)
    doc = resp.json()
    if resp.status_code >= 400:
        assert set(doc["error"]) == {"field", "reason"} and doc["error"]["reason"], doc


@pytest.mark.integration
@fuzz_settings(0.5)
@given(get_requests())
def test_http_get_routes_with_any_parameters(api: Api, request: tuple[str, dict[str, str]]) -> None:  # noqa: F811
    path, params = request
    resp = httpx.get(api.url + path, params=params, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    _assert_answer(resp, raw_ok=path.endswith("/records"))


_JSON: Any = st.recursive(
    st.none() | st.booleans() | _NUMBERS | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def offsets_for_times_bodies(draw: st.DrawFn) -> bytes:
    doc: dict[str, Any] = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "timestamp": _NUMBERS | _JSON,
                "topics": st.lists(_TOPICS | st.text(max_size=8), max_size=3) | _JSON,
                "minus_ms": _NUMBERS | _JSON,
            },
        )
    )
    text = json.dumps(doc).encode()
    return draw(st.just(text) | mutated(text) | st.binary(max_size=40) | st.just(b"[" * 5000))


@pytest.mark.integration
@fuzz_settings(0.5)
@given(offsets_for_times_bodies())
def test_http_offsets_for_times_with_any_body(api: Api, body: bytes) -> None:  # noqa: F811
    resp = httpx.post(
        api.url + "/v1/offsets-for-times",
        content=body,
        timeout=30,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    _assert_answer(resp, raw_ok=False)

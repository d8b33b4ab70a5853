"""The status page at ``/`` in a real headless Chromium against a real uvicorn socket.

Scenario (every expected range is derived from the writers' segment bases, not from rlm's status):
``orders-0`` is tiered up to segment 3, its first segment is then deleted locally and its high
watermark raised to segment 6 → remote-only / both / waiting / not-eligible; ``orders-1`` fully
tiered; ``payments-0`` has a corrupt second segment (quarantined, shown as an error);
``clicks.v2-0`` has HW 0 (nothing eligible). Then one more pass copies the waiting segments and
the open page must show it after its auto-refresh. A screenshot goes to test-artifacts/.
"""

from __future__ import annotations

import html.parser
import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlm.config.brokers import ClusterSettings
from rlm.testing.kraft import MetadataLogBuilder
from tests.needs import unavailable
from tests.ui.chromium import Chromium, Page, dump_dom, find_browser
from tests.ui.fixture import TOKEN, Served, fill, serve, writer

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"

# JS run in the page: every partition row with its rendered ranges.
ROWS_JS = """JSON.stringify([...document.querySelectorAll('#partitions .partition')].map(p => ({
  name: p.dataset.topic + '-' + p.dataset.partition, state: p.dataset.state,
  error: p.dataset.error || null, lag_bytes: Number(p.dataset.lagBytes),
  ranges: [...p.querySelectorAll('.seg')].map(s => [s.dataset.range, Number(s.dataset.start),
                                                    Number(s.dataset.end)])})))"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    exe = find_browser()
    if exe is None:
        unavailable(
            "no Chromium found (chromium, chromium-browser, google-chrome or $RLM_TEST_CHROMIUM): "
            "`make browser` installs Debian's chromium (apt-get, needs root)"
        )
    chromium = Chromium(exe)
    try:
        yield chromium
    finally:
        chromium.close()


@pytest.fixture()
def scenario(tmp_path: Path) -> Iterator[tuple[Served, dict[str, Any]]]:
    served = serve(tmp_path)
    try:
        orders0 = writer(served, "orders", 0)
        fill(orders0, 8)
        b = orders0.segment_base_offsets  # 8 rolled + the empty active one
        orders0.high_watermark = b[3]
        orders0.write_checkpoints()
        orders1 = writer(served, "orders", 1)
        fill(orders1, 5)
        orders1.write_checkpoints()
        pay = writer(served, "payments", 0)
        fill(pay, 4)
        pay.write_checkpoints()
        p = pay.segment_base_offsets
        seg = served.logs / "payments-0" / f"{p[1]:020d}.log"
        data = bytearray(seg.read_bytes())
        data[300] ^= 0xFF  # inside the first batch's records: CRC mismatch
        seg.write_bytes(bytes(data))
        clicks = writer(served, "clicks.v2", 0)
        fill(clicks, 3)
        clicks.high_watermark = 0
        clicks.write_checkpoints()

        served.history.sample()
        served.tier()
        for suffix in (".log", ".index", ".timeindex"):  # the broker's retention deletes segment 0
            (served.logs / "orders-0" / f"{b[0]:020d}{suffix}").unlink()
        orders0.high_watermark = b[6]
        orders0.write_checkpoints()
        expected = {
            "orders-0": [
                ["remote-only", 0, b[1]],
                ["both", b[1], b[3]],
                ["pending", b[3], b[6]],
                ["not-eligible", b[6], orders0.log_end_offset],
            ],
            "orders-1": [["both", 0, orders1.log_end_offset]],
            "payments-0": [["both", 0, p[1]], ["pending", p[1], pay.log_end_offset]],
            "clicks.v2-0": [["not-eligible", 0, clicks.log_end_offset]],
            "after": [
                ["remote-only", 0, b[1]],
                ["both", b[1], b[6]],
                ["not-eligible", b[6], orders0.log_end_offset],
            ],
        }
        yield served, expected
    finally:
        served.close()


def _rows(page: Any) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in json.loads(page.evaluate(ROWS_JS))}


def _assert_quarantine_and_totals_match_the_status(page: Page, rows: dict[str, Any], served: Served) -> None:
    """The page's quarantine details, per-row lag and totals are those of the manager's status."""
    status = {f"{r['topic']}-{r['partition']}": r for r in served.manager.status()}
    # The quarantine's file, byte position and cause (docs/broker-files.md) are in the DOM.
    shown = json.loads(
        page.evaluate(
            "JSON.stringify({...document.querySelector('.partition[data-topic=\"payments\"]').dataset})"
        )
    )
    [q] = status["payments-0"]["quarantine"]
    assert (shown["quarantineFile"], shown["quarantinePosition"], shown["quarantineCause"]) == (
        q["file"],
        str(q["position"]),
        "corrupt",
    )
    assert q["file"].endswith(".log")
    for name, row in rows.items():
        assert row["lag_bytes"] == status[name]["copy_lag_bytes"], name
    totals = page.evaluate("""JSON.stringify(Object.fromEntries([...document.querySelectorAll('[data-total]')]
        .map(c => [c.dataset.total, c.dataset.value])))""")
    totals = json.loads(totals)
    assert int(totals["lag"]) == sum(r["copy_lag_bytes"] for r in status.values()) > 0
    assert int(totals["remote"]) == sum(r["remote_bytes"] for r in status.values()) > 0
    assert int(totals["partitions"]) == 4
    # Pins on sight (docs/operations.md): the segments behind the quarantine stay pinned.
    assert int(totals["pinned"]) == sum(r["pinned_bytes"] for r in status.values()) > 0
    pay = status["payments-0"]  # every pending segment but the quarantined one
    assert shown["pinnedSegments"] == str(pay["pinned_segments"]) == str(pay["copy_lag_segments"] - 1)
    assert page.evaluate("document.querySelector('#pins').hidden")
    # The broker's deadlines (docs/topic-policy.md §8): per row as in status, the nearest on the card.
    assert shown["retentionDeadlineMs"] == str(pay["retention_deadline_ms"])
    deadlines = [
        r["retention_deadline_ms"] for r in status.values() if r["retention_deadline_ms"] is not None
    ]
    assert deadlines and "deadline" in totals
    card = page.evaluate("document.querySelector('[data-total=deadline] .sub').textContent")
    nearest = {
        f"{r['topic']} / {r['partition']} · segment "
        for r in status.values()
        if r["retention_deadline_ms"] == min(deadlines)
    }
    assert any(card.startswith(n) for n in nearest), card
    assert page.evaluate("document.querySelector('#health').dataset.health") == "errors"


def test_status_page_shows_ranges_and_follows_a_copy(
    browser: Chromium, scenario: tuple[Served, dict[str, Any]]
) -> None:
    served, expected = scenario
    page = browser.open()
    page.navigate(f"{served.server.url}/?token={TOKEN}&refresh=1")
    page.wait_for("document.body.dataset.state === 'ready'", what="the first refresh")

    # The token left the address bar for this tab's session storage; it was sent as Bearer.
    assert TOKEN not in page.evaluate("location.href")
    assert page.evaluate("sessionStorage.getItem('rlm.token')") == TOKEN

    rows = _rows(page)
    assert sorted(rows) == ["clicks.v2-0", "orders-0", "orders-1", "payments-0"]
    for name in ("orders-0", "orders-1", "payments-0", "clicks.v2-0"):
        assert rows[name]["ranges"] == expected[name], name
    assert rows["payments-0"]["state"] == "error"
    assert "CRC" in rows["payments-0"]["error"]
    assert rows["orders-0"]["state"] == "lagging" and rows["orders-1"]["state"] == "ok"
    _assert_quarantine_and_totals_match_the_status(page, rows, served)

    # One more pass copies orders-0's waiting segments; the open page picks it up on its own.
    page.evaluate("window.__sameDocument = true")
    refreshes = int(page.evaluate("document.body.dataset.refreshes"))
    served.tier()
    after = json.dumps(json.dumps(expected["after"], separators=(",", ":")))
    page.wait_for(
        f"""(() => {{ const r = {ROWS_JS}; const o = JSON.parse(r).find(x => x.name === 'orders-0');
        return JSON.stringify(o.ranges) === {after}; }})()""",
        timeout_s=30,
        what="orders-0 to show the copied segments",
    )
    assert page.evaluate("window.__sameDocument === true")  # refreshed in place, not reloaded
    assert int(page.evaluate("document.body.dataset.refreshes")) > refreshes
    rows = _rows(page)
    assert rows["orders-0"]["state"] == "ok" and rows["orders-0"]["lag_bytes"] == 0
    assert rows["orders-1"]["ranges"] == expected["orders-1"]

    # The chart: samples before and after each pass; throughput and lag drawn.
    page.wait_for("Number(document.querySelector('#chart').dataset.samples) >= 3", what="3 samples")
    assert page.evaluate("!!document.querySelector('#chart path[data-series=rate]')")
    assert page.evaluate("!!document.querySelector('#chart path[data-series=lag]')")

    shot = page.screenshot(ARTIFACTS / "status-page.png")
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def test_status_page_without_token_asks_for_one(
    browser: Chromium, scenario: tuple[Served, dict[str, Any]]
) -> None:
    served, _ = scenario
    page = browser.open()  # a new tab: empty session storage
    page.navigate(f"{served.server.url}/")
    page.wait_for("document.body.dataset.state === 'unauthorized'", what="the token form")
    assert page.evaluate("document.querySelector('#auth').hidden") is False
    assert page.evaluate("document.querySelectorAll('#partitions .partition').length") == 0

    page.evaluate(
        "document.querySelector('#auth-token').value = 'wrong';"
        "document.querySelector('#auth-form').requestSubmit()"
    )
    page.wait_for(
        "document.querySelector('#auth-reason').textContent.includes('rejected')",
        what="the wrong token to be rejected",
    )
    assert page.evaluate("document.body.dataset.state") == "unauthorized"

    page.evaluate(
        f"document.querySelector('#auth-token').value = {json.dumps(TOKEN)};"
        "document.querySelector('#auth-form').requestSubmit()"
    )
    page.wait_for("document.body.dataset.state === 'ready'", what="data after the right token")
    assert page.evaluate("document.querySelector('#auth').hidden") is True
    assert page.evaluate("document.querySelectorAll('#partitions .partition').length") == 4


class _Segs(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[list[Any]]] = {}
        self._current = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if "partition" in (a.get("class") or "").split():
            self._current = f"{a['data-topic']}-{a['data-partition']}"
            self.rows[self._current] = []
        elif "seg" in (a.get("class") or "").split():
            self.rows[self._current].append(
                [a["data-range"], int(a["data-start"] or 0), int(a["data-end"] or 0)]
            )


def test_dump_dom_of_the_page_with_chromiums_cli(
    browser: Chromium, scenario: tuple[Served, dict[str, Any]]
) -> None:
    """``chromium --dump-dom`` (no DevTools): the ranges are in the DOM it prints."""
    served, expected = scenario
    exe = find_browser()
    assert exe is not None
    dom = dump_dom(exe, f"{served.server.url}/?token={TOKEN}", budget_ms=5000)
    parser = _Segs()
    parser.feed(dom)
    assert parser.rows["orders-0"] == expected["orders-0"], dom[-3000:]
    assert parser.rows["clicks.v2-0"] == expected["clicks.v2-0"]


# -- the HTTP side of the page (no browser) ------------------------------------------------------


def _get(url: str, token: str | None = None) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def test_page_and_assets_load_without_token_but_data_needs_it(
    scenario: tuple[Served, dict[str, Any]],
) -> None:
    served, _ = scenario
    url = served.server.url
    code, body, headers = _get(url + "/")
    assert code == 200 and headers["content-type"].startswith("text/html")
    page = body.decode()
    assert "static/status.js" in page and "static/status.css" in page
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page  # no CDN
    for asset, kind in (("status.js", "javascript"), ("status.css", "text/css")):
        code, body, headers = _get(f"{url}/static/{asset}")
        assert code == 200 and kind in headers["content-type"] and body
        assert b"https://" not in body
    for path in ("/v1/partitions", "/v1/history"):
        assert _get(url + path)[0] == 401
    code, body, _ = _get(url + "/v1/history", TOKEN)
    hist = json.loads(body)
    assert code == 200 and hist["interval_s"] == 1 and hist["window_s"] == 3600
    assert len(hist["samples"]) == 2
    first, second = hist["samples"]
    assert first["copied_bytes"] == 0 and first["copy_bytes_per_sec"] is None
    status = served.manager.status()
    # rlm_remote_copy_bytes also counts the uploaded index objects, so it is >= the segments' bytes
    assert second["copied_bytes"] >= sum(r["remote_bytes"] for r in status) > 0
    assert second["remote_bytes"] == sum(r["remote_bytes"] for r in status)
    assert second["copy_errors"] == 1  # payments-0's corrupt segment
    assert second["copy_bytes_per_sec"] is not None and second["copy_bytes_per_sec"] > 0


def _tiered_page(browser: Chromium, served: Served, partitions: list[tuple[str, int]]) -> Any:
    """Two committed segments per partition, tiered once, and the page loaded with them."""
    for topic, partition in partitions:
        w = writer(served, topic, partition)
        fill(w, 2)
        w.high_watermark = w.log_end_offset
        w.write_checkpoints()
    served.tier()
    page = browser.open()
    page.navigate(f"{served.server.url}/?token={TOKEN}&refresh=1")
    page.wait_for("document.body.dataset.state === 'ready'", what="the first refresh")
    return page


def test_status_page_shows_partitions_the_policy_leaves_alone(browser: Chromium, tmp_path: Path) -> None:
    """docs/topic-policy.md: an internal log is listed as not tiered, with the reason."""
    served = serve(tmp_path)
    try:
        page = _tiered_page(browser, served, [("orders", 0), ("__consumer_offsets", 0)])
        rows = _rows(page)
        assert rows["orders-0"]["state"] == "ok"
        assert rows["__consumer_offsets-0"]["state"] == "excluded"
        reason = page.evaluate(
            "document.querySelector('.partition[data-topic=\"__consumer_offsets\"]').dataset.excludedReason"
        )
        assert reason == served.status("__consumer_offsets", 0)["excluded_reason"]
        assert "internal topic" in reason
        sub = page.evaluate("document.querySelector('[data-total=partitions] .sub').textContent")
        assert "1 not tiered" in sub
        # docs/topic-policy.md §4: a tiered row states what each tier keeps and where it comes from.
        ret = json.loads(
            page.evaluate(
                "(() => { const p = document.querySelector('.partition[data-topic=\"orders\"]');"
                " const r = p.querySelector('.ret'); return JSON.stringify([r.textContent, r.title,"
                " p.dataset.localRetentionMs, p.dataset.retentionMs]); })()"
            )
        )
        policy = served.status("orders", 0)["policy"]
        assert ret[0] == "keeps: local 7 d · remote unlimited"
        assert f"local by time: 604800000 — {policy['local_retention_ms']['from']}" in ret[1]
        assert "remote by size: -1 — [tiering] retention_bytes" in ret[1]
        assert ret[2:] == [str(policy["local_retention_ms"]["value"]), "-1"]
        assert page.evaluate(
            "document.querySelector('.partition[data-topic=\"__consumer_offsets\"] .ret') === null"
        )
    finally:
        served.close()


def test_status_page_shows_each_partitions_role(browser: Chromium, tmp_path: Path) -> None:
    """docs/cluster.md: beside a replicated cluster each row says whether this node leads the
    partition, and a follower's row names the leader."""
    served = serve(
        tmp_path,
        cluster=ClusterSettings(node_id=1, leadership="static", leaders={"orders-0": 1, "orders-1": 2}),
    )
    try:
        page = _tiered_page(browser, served, [("orders", 0), ("orders", 1)])
        roles = json.loads(
            page.evaluate(
                "JSON.stringify([...document.querySelectorAll('.partition')].map(p => "
                "[p.dataset.partition, p.dataset.role, p.dataset.leader, "
                "(p.querySelector('.role') || {}).textContent]))"
            )
        )
        assert sorted(roles) == [["0", "leader", "1", "leader"], ["1", "follower", "2", "follower of node 2"]]
        assert served.status("orders", 1)["highest_tiered_offset"] == -1  # node 2 copies it, not this one
    finally:
        served.close()


def test_status_page_shows_a_log_dir_at_its_pin_bound(browser: Chromium, tmp_path: Path) -> None:
    """docs/operations.md "Pins and the broker's retention": a quarantined segment stops its
    partition, the segments behind it stay pinned; with a bound of one and a half segments the
    next one is refused a pin — the card turns amber and a banner names the log dir."""
    for name in ("probe", "real"):
        (tmp_path / name).mkdir()
    probe = serve(tmp_path / "probe")  # one segment's pinned bytes, as the real one will have
    w = writer(probe, "payments", 0)
    fill(w, 1)
    first = probe.logs / "payments-0"
    one = sum(p.stat().st_size for p in first.iterdir() if p.name.startswith(f"{0:020d}."))
    probe.close()
    served = serve(tmp_path / "real", max_pinned_bytes=one * 3 // 2 + 32)
    try:
        pay = writer(served, "payments", 0)
        fill(pay, 5)
        pay.high_watermark = pay.log_end_offset
        pay.write_checkpoints()
        p = pay.segment_base_offsets
        seg = served.logs / "payments-0" / f"{p[1]:020d}.log"
        data = bytearray(seg.read_bytes())
        data[300] ^= 0xFF  # a CRC mismatch: quarantined, the partition stops behind it
        seg.write_bytes(bytes(data))
        served.tier()
        status = served.status("payments", 0)
        assert (status["pinned_segments"], status["pin_refused_offset"]) == (1, p[3])
        page = browser.open()
        page.navigate(f"{served.server.url}/?token={TOKEN}&refresh=1")
        page.wait_for("document.body.dataset.state === 'ready'", what="the first refresh")
        card = json.loads(
            page.evaluate("JSON.stringify({...document.querySelector('[data-total=pinned]').dataset})")
        )
        assert card == {"total": "pinned", "state": "warn", "value": str(status["pinned_bytes"])}
        banner = page.evaluate("document.querySelector('#pins').textContent")
        assert not page.evaluate("document.querySelector('#pins').hidden")
        assert str(served.logs) in banner and "reached tiering.max_pinned_bytes" in banner
        assert "pending segments of 1 partition are not pinned" in banner
        assert page.screenshot(ARTIFACTS / "status-page-pins.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        served.close()


def test_status_page_counts_deleted_topics_waiting_for_their_grace(browser: Chromium, tmp_path: Path) -> None:
    """docs/topic-identity.md "Deleted topics": a topic deleted on the broker keeps its remote data
    for tiering.deleted_topic_grace_ms; the card counts it, its bytes and when it goes."""
    logs = tmp_path / "kafka-logs"
    logs.mkdir()
    (logs / "meta.properties").write_text("version=1\nnode.id=1\n")
    meta = MetadataLogBuilder(logs)
    topic_id = meta.create_topic("gone", [[1]])
    served = serve(tmp_path, deleted_topic_grace_ms=3_600_000)
    try:
        w = writer(served, "gone", 0, topic_id=topic_id)
        fill(w, 2)
        w.high_watermark = w.log_end_offset
        w.write_checkpoints()
        served.tier()
        assert served.status("gone", 0)["highest_tiered_offset"] > 0
        served.writers.pop("gone-0").close()
        meta.delete_topic("gone")
        shutil.rmtree(logs / "gone-0")
        served.manager.collect_garbage()
        [waiting] = served.manager.deleted.status()
        page = browser.open()
        page.navigate(f"{served.server.url}/?token={TOKEN}&refresh=1")
        page.wait_for("document.body.dataset.state === 'ready'", what="the first refresh")
        card = json.loads(
            page.evaluate(
                "(() => { const c = document.querySelector('[data-total=deleted]');"
                " const t = (s) => c.querySelector(s).textContent;"
                " return JSON.stringify([c.dataset.value, t('.value'), t('.sub')]); })()"
            )
        )
        assert card[:2] == ["1", "1"], card
        assert card[2].startswith("1 partition · ") and "next deleted" in card[2], card
        assert waiting["delete_after_ms"] is not None and waiting["bytes"] > 0
    finally:
        served.close()
        meta.close()

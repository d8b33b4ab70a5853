"""configs/grafana-dashboard.json: valid, and every metric it queries exists in a live registry
(and every rlm metric appears on some panel)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from rlm.cli.wiring import build_api
from rlm.config import settings_from_mapping
from rlm.storage.memory import MemoryBackend
from rlm.tiering.manager import RemoteLogManager

DASHBOARD = Path(__file__).resolve().parents[2] / "configs" / "grafana-dashboard.json"
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count", "_created"),
}


def _live_registry(tmp_path: Path) -> CollectorRegistry:
    """The registry `rlm run` serves, wired as `rlm run` wires it (rlm.cli.wiring): the manager's
    metrics (role and topic-policy gauges), the readers' range cache and read-ahead, the HTTP app's."""
    settings = settings_from_mapping(
        {"log": {"dirs": [str(tmp_path)]}, "remote": {"backend": "memory", "options": {}}}
    )
    return build_api(settings, RemoteLogManager(settings, MemoryBackend())).registry


def _exposed_names(registry: CollectorRegistry) -> dict[str, str]:
    """Every series name /metrics can expose → its family name."""
    names = {}
    for family in registry.collect():
        for suffix in _SUFFIXES[family.type]:
            names[family.name + suffix] = family.name
    return names


def _panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in doc["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def test_dashboard_is_valid_grafana_json() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] and doc["schemaVersion"] >= 30
    panels = _panels(doc)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] != "row":
            assert p["targets"], p["title"]
            assert all(t["expr"].strip() and t["refId"] for t in p["targets"]), p["title"]
    assert [v["name"] for v in doc["templating"]["list"]] == ["topic"]


def test_every_metric_in_the_dashboard_exists_and_every_metric_is_shown(tmp_path: Path) -> None:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in _panels(doc) for t in p.get("targets", [])]
    exprs += [v["definition"] for v in doc["templating"]["list"]]
    used = {m for e in exprs for m in re.findall(r"\brlm_[a-z0-9_]+", e)}
    registry = _live_registry(tmp_path)
    exposed = _exposed_names(registry)
    missing = sorted(used - set(exposed))
    assert not missing, f"dashboard queries metrics rlm does not export: {missing}"
    # The names really appear in the exposition once the metrics have a child.
    text = generate_latest(registry).decode()
    for name in sorted(n for n in exposed.values() if n in used and f"# TYPE {n} " not in text):
        raise AssertionError(f"{name} not in /metrics")
    shown = {exposed[m] for m in used}
    unshown = sorted(set(exposed.values()) - shown)
    assert not unshown, f"metrics without a panel: {unshown}"

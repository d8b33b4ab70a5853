from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Literal

import pytest

from rlm.config import Settings, load_settings, settings_from_mapping
from rlm.config import validators as v
from rlm.config.keys import declared, keys_of
from rlm.config.reference import default_text, reference_markdown
from rlm.errors import ConfigError

FULL = """
[log]
dirs = ["/var/lib/kafka/data", "relative/logs"]
eligibility = "rolled"
[remote]
backend = "s3"
[remote.options]
bucket = "tiered"
prefix = "prod"
[tiering]
task_interval_ms = 5000
index_entry_bytes = 65536
index_rotate_bytes = 1048576
index_rotate_ms = 3600000
retention_ms = 86400000
retention_bytes = -1
[server]
host = "127.0.0.1"
port = 9464
token = "s3cret"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rlm.toml"
    path.write_text(text)
    return path


def test_every_design_key_is_read(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, FULL), environ={})
    assert s.log.dirs == (Path("/var/lib/kafka/data"), Path.cwd() / "relative/logs")
    assert s.log.eligibility == "rolled"
    assert s.remote.backend == "s3" and s.remote.options == {"bucket": "tiered", "prefix": "prod"}
    t = s.tiering
    assert (t.task_interval_ms, t.index_entry_bytes, t.index_rotate_bytes, t.index_rotate_ms) == (
        5000,
        65536,
        1048576,
        3600000,
    )
    assert (t.retention_ms, t.retention_bytes) == (86400000, -1)
    assert (s.server.host, s.server.port, s.server.token) == ("127.0.0.1", 9464, "s3cret")
    assert "s3cret" not in repr(s)


def test_defaults_follow_design(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, ""), environ={})
    assert s.server.host == "127.0.0.1"  # never 0.0.0.0 by default
    assert s.log.eligibility == "high-watermark"
    assert s.tiering.index_entry_bytes == 1048576
    assert s.tiering.max_pinned_bytes == 4 << 30  # per log dir (docs/operations.md)
    assert s.tiering.deadline_warn_ms == 600_000  # 10 min (docs/topic-policy.md §8)
    assert isinstance(s, Settings)


def test_env_overrides_parse_toml_values_and_nest(tmp_path: Path) -> None:
    env = {
        "RLM_TIERING__RETENTION_MS": "1000",
        "RLM_LOG__DIRS": '["/a", "/b"]',
        "RLM_SERVER__TOKEN": "plain-string",
        "RLM_REMOTE__OPTIONS__BUCKET": "other",
        "UNRELATED": "x",
    }
    s = load_settings(write(tmp_path, FULL), environ=env)
    assert s.tiering.retention_ms == 1000
    assert s.log.dirs == (Path("/a"), Path("/b"))
    assert s.server.token == "plain-string"
    assert s.remote.options["bucket"] == "other"


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("[tiering]\nindex_entry_bytes = -5", ["tiering.index_entry_bytes", "-5", "integer"]),
        ("[tiering]\nretention_ms = -2", ["tiering.retention_ms", "-2", "-1 to disable"]),
        ("[tiering]\nmax_pinned_bytes = -7", ["tiering.max_pinned_bytes", "-7", "[0, 9223372036854775807]"]),
        ("[tiering]\nmax_pinned_bytes = 1.5", ["tiering.max_pinned_bytes", "1.5", "-1 to disable"]),
        ("[tiering]\ndeadline_warn_ms = -3", ["tiering.deadline_warn_ms", "-3", "-1 to disable"]),
        ("[tiering]\nretension_ms = 5", ["unknown key tiering.retension_ms", "retention_ms"]),
        ('[log]\neligibility = "always"', ["log.eligibility", "'always'", "high-watermark"]),
        ("[log]\ndirs = []", ["log.dirs", "non-empty list"]),
        ("[server]\nport = 70000", ["server.port", "70000"]),
        ("[server]\nport = true", ["server.port", "True"]),
        ("[server]\nmax_decoded_bytes = 0", ["server.max_decoded_bytes", "0", "integer"]),
        ("[server]\nmax_connections = 0", ["server.max_connections", "0", "integer"]),
        ('[server]\nserve_internal_topics = "yes"', ["server.serve_internal_topics", "'yes'", "true"]),
        ("[server]\nallow_insecure_exposure = 1", ["server.allow_insecure_exposure", "1", "true or false"]),
        ("[bogus]\nx = 1", ["unknown section [bogus]"]),
        ("[tiering\n", ["not valid TOML"]),
        ('[iceberg]\ntable = "a.b"', ["iceberg.table", "'a.b'", "'.'"]),
        ('[iceberg]\nnamespace = ""', ["iceberg.namespace", "empty"]),
        ("[iceberg]\ncatalog = 5", ["iceberg.catalog", "table of catalog properties"]),
        ("[iceberg.catalog]\nx = [1]", ['iceberg.catalog."x"', "string, number or boolean"]),
    ],
)
def test_bad_config_names_key_value_and_what_is_allowed(
    tmp_path: Path, text: str, needles: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text), environ={})
    for needle in needles:
        assert needle in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", environ={})


def test_bad_env_override_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tiering\.task_interval_ms"):
        load_settings(write(tmp_path, ""), environ={"RLM_TIERING__TASK_INTERVAL_MS": "fast"})


def test_iceberg_catalog_properties_become_strings_and_env_overrides_nest(tmp_path: Path) -> None:
    text = '[iceberg]\nnamespace = "ops"\n[iceberg.catalog]\ntype = "rest"\n"s3.path-style-access" = true\n'
    s = load_settings(
        write(tmp_path, text),
        environ={"RLM_ICEBERG__CATALOG__URI": "http://cat:8181", "RLM_ICEBERG__TABLE": "history"},
    )
    assert s.iceberg.catalog == {"type": "rest", "s3.path-style-access": "true", "uri": "http://cat:8181"}
    assert (s.iceberg.namespace, s.iceberg.table, s.iceberg.catalog_name) == ("ops", "history", "rlm")
    assert load_settings(write(tmp_path, ""), environ={}).iceberg.catalog == {}  # embedded SQLite


# --- the declaration (rlm/config/keys.py) is the one source of every key ------------------------

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- config-reference:begin -->\n", "<!-- config-reference:end -->"


def _embedded_reference(page: str) -> str:
    text = (REPO / page).read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1, page
    return text.split(BEGIN, 1)[1].split(END, 1)[0]


@pytest.mark.parametrize("page", ["README.md", "docs/configuration.md"])
def test_every_declared_key_and_its_default_is_in_the_docs(page: str) -> None:
    text = _embedded_reference(page)
    keys = list(declared(Settings))
    assert len(keys) > 60  # every section's keys, sub-tables and override keys included
    for d in keys:
        row = f"| `{'.'.join(d.path[1:])}` | `{default_text(d)}` | {d.key.check.allowed} |"
        assert row in text, f"{page}: {d.name} (default {default_text(d)}) is missing or stale"
    assert text == reference_markdown(), f"{page}: regenerate with `python -m rlm.config --reference`"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    return str(value)


def test_each_derived_env_name_reaches_its_key(tmp_path: Path) -> None:
    """The variable the reference prints sets that key: its default comes back through it, and a
    value the key's validator refuses is reported under the key's name."""
    path = write(tmp_path, "")
    checked = 0
    for d in declared(Settings):
        if d.key.env in ("none", "names"):
            continue
        with pytest.raises(ConfigError, match=rf"config key {re.escape(d.name)} = "):
            load_settings(path, environ={d.env: "[[]]"})  # no key accepts a list of lists
        checked += 1
        if d.default is None:  # unset: nothing to write back
            continue
        text = "{}" if d.key.env == "inline" else _toml(d.default)  # a table, given whole
        node: object = load_settings(path, environ={d.env: text})
        for part in d.path:
            node = getattr(node, part)
        assert node == d.default, d.name
    assert checked > 60


def test_table_keys_set_per_name_from_the_environment(tmp_path: Path) -> None:
    named = [d for d in declared(Settings) if d.key.env == "names"]
    assert [d.name for d in named] == ["remote.options", "iceberg.catalog"]
    env = {d.env.replace("<NAME>", "ZONE"): "a" for d in named}
    s = load_settings(write(tmp_path, ""), environ=env)
    assert s.remote.options == {"zone": "a"} and s.iceberg.catalog == {"zone": "a"}


def test_allowed_text_is_the_validators_declared_bounds_not_its_error_text() -> None:
    check = v.integer(1, 1024)
    assert check.allowed == "[1, 1024]"
    with pytest.raises(ConfigError, match=r"must be an integer in \[1, 1024\]$"):
        check("k", 1025)
    assert v.integer(0, disabled=-1).allowed == "[0, 2⁶³−1] or -1 to disable"
    with pytest.raises(ConfigError, match=r"\[0, 9223372036854775807\] or -1 to disable$"):
        v.integer(0, disabled=-1)("k", -2)  # the message keeps the digits
    assert v.integer(0, v.INT32_MAX).allowed == "[0, 2³¹−1]"
    assert v.one_of(Literal["a", "b-c"]).allowed == "`a`, `b-c`"
    with pytest.raises(ConfigError, match=r"must be one of 'a', 'b-c'$"):
        v.one_of(Literal["a", "b-c"])("k", "x")


def test_choices_come_from_the_fields_literal_type() -> None:
    from rlm.config.brokers import ClusterSettings

    hints = typing.get_type_hints(ClusterSettings)
    for name in ("leadership", "security_protocol", "sasl_mechanism"):
        choices = typing.get_args(hints[name])
        assert keys_of(ClusterSettings)[name].check.allowed == ", ".join(f"`{c}`" for c in choices)
        for choice in choices:  # each accepted, nothing else
            assert keys_of(ClusterSettings)[name].check(f"cluster.{name}", choice) == choice


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"remote": {"compression": {"level": 30, "codec": "lz4"}}}, "remote.compression.codec = 'lz4'"),
        (
            {"remote": {"compression": {"bogus": 1}}},
            "unknown key remote.compression.bogus; known keys: codec, level",
        ),
        ({"remote": {"encryption": {"active_key": "k"}}}, "remote.encryption.active_key = 'k': not in"),
        ({"topics": {"overrides": {"a*": {"retention_ms": -3}}}}, 'topics.overrides."a*".retention_ms = -3'),
        (
            {"topics": {"overrides": {"a*": {"x": 1}}}},
            'unknown key topics.overrides."a*".x; known keys: retention_ms',
        ),
        ({"tiering": {"retention_ms": -3, "task_interval_ms": 1}}, "tiering.retention_ms = -3"),
        ({"cluster": {"leadership": "static"}}, "config key cluster.leaders is empty"),
        (
            {"cluster": {"log_start_max_age_ms": -2}},
            "cluster.log_start_max_age_ms = -2: must be an integer in [0, 9223372036854775807] or -1",
        ),
        (  # the log start check connects with the same credentials as kafka-admin leadership
            {"cluster": {"bootstrap_servers": "b:9092", "security_protocol": "SASL_SSL"}},
            "config key cluster.sasl_username is empty: security_protocol = 'SASL_SSL' needs",
        ),
        ({"kafka": {"tls_cert": "/c"}}, "config key kafka.tls_key is empty"),
        ({"kafka": {"groups": "own"}}, "kafka.groups = 'own': must be one of 'auto', 'refuse'"),
        ({"kafka": {"coordinator_bootstrap": ["b"]}}, "kafka.coordinator_bootstrap"),
    ],
)
def test_sub_tables_and_section_checks_keep_their_order_and_messages(
    raw: dict[str, object], message: str
) -> None:
    """A sub-table is read in declaration order (codec before level, key_files before
    active_key); a section in the file's order; cross-key checks once the table is read."""
    with pytest.raises(ConfigError) as info:
        settings_from_mapping(raw, source="f")
    assert message in str(info.value)

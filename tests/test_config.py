from __future__ import annotations

from pathlib import Path

import pytest

from rlm.config import Settings, load_settings
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
        ("[tiering]\nretension_ms = 5", ["unknown key tiering.retension_ms", "retention_ms"]),
        ('[log]\neligibility = "always"', ["log.eligibility", "'always'", "high-watermark"]),
        ("[log]\ndirs = []", ["log.dirs", "non-empty list"]),
        ("[server]\nport = 70000", ["server.port", "70000"]),
        ("[server]\nport = true", ["server.port", "True"]),
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

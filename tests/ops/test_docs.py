"""The README's generated configuration reference is current; every key is documented; the
deployment files parse."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

from rlm.config import _SCHEMA
from rlm.config.reference import KEY_DOCS, reference_markdown

REPO = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- config-reference:begin -->\n", "<!-- config-reference:end -->"


def test_every_config_key_is_documented() -> None:
    keys = {f"{section}.{name}" for section, (_, validators) in _SCHEMA.items() for name in validators}
    assert keys - set(KEY_DOCS) == set(), "add a meaning to rlm.config.KEY_DOCS"
    assert set(KEY_DOCS) - keys == set(), "KEY_DOCS names a key that does not exist"
    text = reference_markdown()
    for key in keys:
        assert f"| `{key.split('.')[1]}` |" in text
        assert f"RLM_{key.split('.')[0].upper()}__" in text


def test_readme_contains_the_current_reference() -> None:
    readme = (REPO / "README.md").read_text()
    assert readme.count(BEGIN) == 1 and readme.count(END) == 1
    embedded = readme.split(BEGIN, 1)[1].split(END, 1)[0]
    assert embedded == reference_markdown(), (
        "README.md's configuration reference is stale: replace the text between the "
        "config-reference markers with the output of `python -m rlm.config --reference`")


def test_reference_command_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "rlm.config", "--reference"], capture_output=True,
                          text=True, check=False, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout == reference_markdown(), proc.stderr
    assert "Warning" not in proc.stderr
    bad = subprocess.run([sys.executable, "-m", "rlm.config"], capture_output=True, text=True,
                         check=False, cwd=REPO)
    assert bad.returncode == 2 and "usage" in bad.stdout


def test_systemd_unit_runs_rlm_with_a_config() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((REPO / "configs" / "rlm.service").read_text())
    exec_start = unit["Service"]["ExecStart"].split()
    assert exec_start[0].endswith("/rlm") and exec_start[1] == "run" and "--config" in exec_start
    assert unit["Service"]["RestartPreventExitStatus"] == "2"     # config errors exit 2
    assert unit["Service"]["KillSignal"] == "SIGTERM"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_package_data_ships_every_status_page_file() -> None:
    import fnmatch
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = setuptools["package-data"]["rlm.http"]
    static = REPO / "rlm" / "http" / "static"
    files = [p.relative_to(static.parent).as_posix() for p in static.iterdir() if p.is_file()]
    assert {"static/index.html", "static/status.css", "static/status.js"} <= set(files)
    for name in files:
        assert any(fnmatch.fnmatch(name, g) for g in globs), f"{name} would not be packaged"

"""The README's generated configuration reference is current; every key is documented; the
deployment files parse; the docs name files and functions that exist."""

from __future__ import annotations

import configparser
import re
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


def _defined_names() -> tuple[set[str], dict[str, set[str]]]:
    """Every name rlm and its plugins define (functions, classes, assignments, string constants,
    module names), overall and per module / class name (a class's names are its module's)."""
    # Builtins and the standard library's modules (``memoryview``, ``stat``) are names too.
    everywhere: set[str] = set(dir(__import__("builtins"))) | set(sys.stdlib_module_names)
    by_scope: dict[str, set[str]] = {}
    for path in [*(REPO / "rlm").rglob("*.py"), *(REPO / "plugins").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        names = set(re.findall(r"^\s*(?:async\s+)?def\s+(\w+)", text, re.MULTILINE))
        classes = set(re.findall(r"^\s*class\s+(\w+)", text, re.MULTILINE))
        names |= classes | set(re.findall(r"^\s*(\w+)\s*[:=]", text, re.MULTILINE))
        names |= set(re.findall(r"[\"'](\w+)[\"']", text))
        everywhere |= names | set(path.relative_to(REPO).with_suffix("").parts)
        for scope in (path.stem, *classes):
            by_scope.setdefault(scope, set()).update(names)
    return everywhere, by_scope


def test_architecture_names_only_what_exists() -> None:
    """docs/architecture.md walks a copy and a lookup through the code by name (``copy_segment``,
    ``remote_sets.chain_from``, ``RemoteLogManager.run_partition``): each name must still exist,
    in the module or class it is qualified with."""
    everywhere, by_scope = _defined_names()
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = []
    for token in sorted(set(re.findall(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)`", text))):
        if re.search(r"\.(?:py|json|jsonl|md|toml)$", token):
            continue  # a file name: the path citations are checked elsewhere
        module = REPO / token.replace(".", "/")
        if token.startswith("rlm.") and (module.is_dir() or module.with_suffix(".py").is_file()):
            continue  # a module named by its dotted path
        *qualifiers, name = token.split(".")
        scope = by_scope.get(qualifiers[-1]) if qualifiers else None
        if name not in (scope if scope is not None else everywhere):
            missing.append(token)
    assert not missing, f"docs/architecture.md names what the code no longer defines: {missing}"


def test_files_named_in_docs_exist() -> None:
    """The README, CONTRIBUTING.md and docs/ send a newcomer to files by path: those files exist.
    (Only paths with a file extension: directories such as ``bench/out/`` may be generated.)"""
    path_re = re.compile(r"(?<![\w/.~$-])((?:rlm|tests|bench|plugins|configs|docs)/[\w./-]*\w)")
    missing = []
    for page in [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]:
        for named in sorted(set(path_re.findall(page.read_text(encoding="utf-8")))):
            if "." in named.rsplit("/", 1)[-1] and not (REPO / named).exists():
                missing.append(f"{page.relative_to(REPO)}: {named}")
    assert not missing, "these files do not exist:\n" + "\n".join(missing)

"""The README's generated configuration reference is current; every key is documented; the
deployment files parse; the docs name files and functions that exist."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path

from rlm.config import Settings
from rlm.config.keys import declared
from rlm.config.reference import reference_markdown

REPO = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- config-reference:begin -->\n", "<!-- config-reference:end -->"


def test_every_config_key_is_documented() -> None:
    text = reference_markdown()
    for d in declared(Settings):
        assert d.key.doc and d.key.check.allowed, f"{d.name}: declare its meaning and allowed values"
        assert f"| `{'.'.join(d.path[1:])}` |" in text
        assert d.env == "" or d.env in text


def test_readme_contains_the_current_reference() -> None:
    readme = (REPO / "README.md").read_text()
    assert readme.count(BEGIN) == 1 and readme.count(END) == 1
    embedded = readme.split(BEGIN, 1)[1].split(END, 1)[0]
    assert embedded == reference_markdown(), (
        "README.md's configuration reference is stale: replace the text between the "
        "config-reference markers with the output of `python -m rlm.config --reference`"
    )


def test_reference_command_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rlm.config", "--reference"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert proc.returncode == 0 and proc.stdout == reference_markdown(), proc.stderr
    assert "Warning" not in proc.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "rlm.config"], capture_output=True, text=True, check=False, cwd=REPO
    )
    assert bad.returncode == 2 and "usage" in bad.stdout


def test_systemd_unit_runs_rlm_with_a_config() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((REPO / "configs" / "rlm.service").read_text())
    exec_start = unit["Service"]["ExecStart"].split()
    assert exec_start[0].endswith("/rlm") and exec_start[1] == "run" and "--config" in exec_start
    assert unit["Service"]["RestartPreventExitStatus"] == "2"  # config errors exit 2
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


# --- citations point inside the repo (docs/formats.md, docs/architecture.md, ...) ---------------

#: A citation of the design/format briefs the repo was started from, which it does not contain
#: ("<BRIEF>.md", "<BRIEF> §2", "<BRIEF>' rule", "<BRIEF>: ..."): cite docs/ instead.
_BRIEF_CITATION = re.compile(r"\b(?:DESIGN|FORMATS)(?:\.md\b|\s*§|'s?\s|:\s)")
#: ``docs/<page>.md``, optionally with sections: ``§5.1``, ``§4.2, §5.3``, ``§2 and §3``.
_DOC_CITATION = re.compile(
    r"\bdocs/([A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.md)"
    r"((?:\s*(?:,|and|/)?\s*§\s*\d+(?:\.\d+)*)*)"
)
_SECTION = re.compile(r"§\s*(\d+(?:\.\d+)*)")
#: A numbered heading: ``## 5. The remote index set``, ``### 5.1 `.remotelogindex` ``.
_NUMBERED_HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.MULTILINE)
_TEXT_SUFFIXES = {
    ".py",
    ".pyi",
    ".c",
    ".h",
    ".toml",
    ".md",
    ".txt",
    ".cfg",
    ".ini",
    ".yml",
    ".yaml",
    ".html",
    ".js",
    ".css",
    ".json",
    ".service",
    ".sh",
}
_CODE_ROOTS = ("rlm", "plugins", "bench", "tests")
_CITING_FILES = (
    "README.md",
    "CONTRIBUTING.md",
    "BENCHMARKS.md",
    "Makefile",
    "pyproject.toml",
    "setup.py",
    "docker-compose.yml",
)


def doc_sections(text: str) -> set[str]:
    """The section numbers a docs page defines by its numbered headings."""
    return set(_NUMBERED_HEADING.findall(text))


def bad_citations(
    text: str, docs_dir: Path, *, own_sections: set[str] | None = None
) -> list[tuple[int, str]]:
    """Each citation in ``text`` that points outside the repo, at a docs page that does not exist,
    or at a section the page does not define: ``(character position, what is wrong)``.

    A ``§N`` that follows no ``docs/<page>.md`` refers to ``own_sections`` (the sections of the docs
    page ``text`` is); outside docs/ (``own_sections`` None) it is a citation without its page."""
    problems: list[tuple[int, str]] = []
    cited: set[int] = set()  # positions of the § already judged as part of a citation
    for m in _BRIEF_CITATION.finditer(text):
        problems.append((m.start(), f"cites the brief {m.group(0).strip()!r}"))
        cited.update(i for i in range(m.start(), m.end()) if text[i] == "§")
    for m in _DOC_CITATION.finditer(text):
        page, path = m.group(1), docs_dir / m.group(1)
        sections = _SECTION.findall(m.group(2))
        cited.update(s.start() for s in _SECTION.finditer(text, m.start(2), m.end(2)))
        if not path.is_file():
            problems.append((m.start(), f"cites docs/{page}, which does not exist"))
            continue
        defined = doc_sections(path.read_text(encoding="utf-8")) if sections else set()
        problems += [
            (m.start(), f"cites docs/{page} §{n}, which has no such numbered heading")
            for n in sections
            if n not in defined
        ]
    for m in _SECTION.finditer(text):
        if m.start() in cited:
            continue
        if own_sections is None:
            problems.append((m.start(), f"cites §{m.group(1)} without naming its docs/ page"))
        elif m.group(1) not in own_sections:
            problems.append((m.start(), f"cites §{m.group(1)}, which this page does not define"))
    return sorted(problems)


def _text_files(root: Path) -> list[Path]:
    return [
        path
        for path in sorted(root.rglob("*"))
        if path.is_file()
        and path.suffix in _TEXT_SUFFIXES
        and not any(p == "__pycache__" or p.endswith(".egg-info") for p in path.parts)
    ]


def test_every_citation_points_into_docs() -> None:
    """Code, tests, benches, plugins, README and docs cite docs/ pages and sections that exist."""
    docs_dir = REPO / "docs"
    checks: list[tuple[Path, set[str] | None]] = [
        (REPO / n, None) for n in _CITING_FILES if (REPO / n).is_file()
    ]
    for root in _CODE_ROOTS:
        # This file's samples are wrong citations on purpose (the test below checks they are caught).
        checks += [(path, None) for path in _text_files(REPO / root) if path != Path(__file__).resolve()]
    checks += [(path, doc_sections(path.read_text(encoding="utf-8"))) for path in _text_files(docs_dir)]
    found = []
    for path, own in checks:
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [
            f"{path.relative_to(REPO)}:{text.count(chr(10), 0, at) + 1}: {what}"
            for at, what in bad_citations(text, docs_dir, own_sections=own)
        ]
    assert not found, "citations must point at docs/ pages and sections that exist:\n" + "\n".join(found)


def test_citation_check_catches_what_it_must(tmp_path: Path) -> None:
    (tmp_path / "formats.md").write_text("# F\n\n## 5. Remote index set\n\n### 5.1 `.remotelogindex`\n")
    brief, missing = "DESIGN", "docs/nope.md"

    def problems(text: str, own: set[str] | None = None) -> list[str]:
        return [what for _, what in bad_citations(text, tmp_path, own_sections=own)]

    assert problems("see docs/formats.md §5.1 and docs/formats.md §5, docs/formats.md.") == []
    assert problems("docs/formats.md\n    §5.1") == []  # a citation wrapped in a docstring
    assert problems("docs/formats.md §5, §5.1 and §5") == []
    assert len(problems(f"{brief} §4, {brief}.md, FORMATS" + " §2")) == 3
    assert problems("docs/formats.md §5.2") == [
        "cites docs/formats.md §5.2, which has no such numbered heading"
    ]
    assert problems("docs/formats.md §5.1, §4") == [
        "cites docs/formats.md §4, which has no such numbered heading"
    ]
    assert problems(missing) == [f"cites {missing}, which does not exist"]
    assert problems("the caller scans them, §3") == ["cites §3 without naming its docs/ page"]
    assert problems("as §5.1 says", own={"5", "5.1"}) == []
    assert problems("as §6 says", own={"5"}) == ["cites §6, which this page does not define"]
    assert problems(f"{brief}_KEYS = {{}}") == []  # a name, not a citation


def test_the_specification_pages_exist_and_are_linked() -> None:
    readme, contributing = (REPO / "README.md").read_text(), (REPO / "CONTRIBUTING.md").read_text()
    for page in ("formats.md", "architecture.md", "configuration.md", "cli.md", "http-api.md"):
        assert (REPO / "docs" / page).is_file(), page
        assert f"docs/{page}" in readme and f"docs/{page}" in contributing, page
    formats = doc_sections((REPO / "docs" / "formats.md").read_text())
    assert {"5", "5.1", "5.2", "5.3", "6", "6.1", "6.3", "7"} <= formats
    assert "make test-fast" in contributing and "make test-fast" in readme

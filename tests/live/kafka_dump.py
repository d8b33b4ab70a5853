"""Kafka's ``kafka.tools.DumpLogSegments`` run on files, its text output parsed (Kafka 4.1's layout).

The tool prints, per file, ``Dumping <path>`` and then, for a ``.log``::

    Log starting offset: 1156
    baseOffset: 1156 lastOffset: 1171 count: 16 baseSequence: 256 lastSequence: 271 producerId: 3
        ... isControl: false deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 17958...
        size: 15793 magic: 2 compresscodec: lz4 crc: 1307753188 isvalid: true        (one line)
    | offset: 1156 CreateTime: 17958... keySize: 4 valueSize: 1000 sequence: 256 headerKeys: [n]
        key: k256 payload: 0000...                                                   (one line)
    | offset: 1550 CreateTime: ... headerKeys: [] endTxnMarker: COMMIT coordinatorEpoch: 0

A batch line is ``name: value`` pairs whose values are single tokens, as is each entry line of an
index (``offset: 79 position: 4721``), transaction index or producer snapshot
(:func:`parse_entries`). A record line has a fixed head (offset, timestamp, sizes, sequence, header
keys) and a free tail — `` key: K`` when the key is not null, `` payload: V`` when the value is not
null (both UTF-8 decoded; either may hold spaces or newlines), or a control record's marker — which
callers compare whole against the tail they expect instead of splitting it. A value with a newline
continues on the next lines: lines that start no known form are joined to the record before them.
Anything else the tool prints about a ``.log`` is kept in :attr:`DumpedFile.notes`; :func:`problems`
finds the lines saying something is wrong in any file (invalid bytes, index mismatches, ...).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from rlm.testing.kafka_cluster import run_kafka_tool

__all__ = [
    "DumpedBatch",
    "DumpedFile",
    "DumpedRecord",
    "dump_log_segments",
    "parse_dump",
    "parse_entries",
    "problems",
]

DUMP = "kafka.tools.DumpLogSegments"

_RECORD = re.compile(
    r"^\| offset: (?P<offset>-?\d+) (?P<ts_type>\w+): (?P<timestamp>-?\d+) keySize: (?P<key_size>-?\d+) "
    r"valueSize: (?P<value_size>-?\d+) sequence: (?P<sequence>-?\d+) headerKeys: \[(?P<headers>[^\]]*)\]"
    r"(?P<tail>.*)$",
    re.DOTALL,
)
_STARTS = ("Dumping ", "Log starting offset: ", "baseOffset: ", "| offset: ")

#: What DumpLogSegments prints when it finds something wrong in a log or an index.
PROBLEM_WORDS = (
    "invalid bytes",
    "isvalid: false",
    "Mismatches in",
    "mismatch",
    "out of order",
    "Non-consecutive",
    "Exception",
    "corrupt",
    "failed",
)


@dataclass
class DumpedRecord:
    offset: int
    timestamp_type: str
    timestamp: int
    key_size: int
    value_size: int
    sequence: int
    header_keys: list[str]
    tail: str


@dataclass
class DumpedBatch:
    fields: dict[str, str]
    timestamp_type: str
    records: list[DumpedRecord] = field(default_factory=list)


@dataclass
class DumpedFile:
    path: str
    log_start: int | None = None
    batches: list[DumpedBatch] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


_GAP = re.compile(r"^(Non-consecutive offsets in (?P<file>.+)|  \d+ is followed by \d+)$")


def dump_log_segments(files: list[Path], *options: str, gaps_in: Collection[Path] = ()) -> str:
    """DumpLogSegments' stdout for ``files``; a non-zero exit or anything on stderr fails, except
    the tool's report of offset gaps (``Non-consecutive offsets in F``, with ``--deep-iteration``)
    for the files of ``gaps_in``: what compaction leaves."""
    done = run_kafka_tool(DUMP, *options, "--files", ",".join(map(str, files)), timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    allowed = set(map(str, gaps_in))
    for line in done.stderr.splitlines():
        m = _GAP.match(line)
        assert m is not None and (m["file"] is None or m["file"] in allowed), done.stderr[-2000:]
    return done.stdout


def _lines(text: str) -> list[str]:
    """Physical lines joined into logical ones: a line starting no known form continues the
    record line before it (a value holding a newline)."""
    out: list[str] = []
    text = text[:-1] if text.endswith("\n") else text  # the last println's newline ends no value
    for line in text.split("\n"):
        if out and out[-1].startswith("| offset: ") and not line.startswith(_STARTS):
            out[-1] += "\n" + line
        else:
            out.append(line)
    return out


def _batch(line: str) -> DumpedBatch:
    tokens = line.split(" ")
    assert len(tokens) % 2 == 0 and all(t.endswith(":") for t in tokens[0::2]), line
    fields = {name[:-1]: value for name, value in zip(tokens[0::2], tokens[1::2], strict=True)}
    kinds = [k for k in ("CreateTime", "LogAppendTime", "NoTimestampType") if k in fields]
    assert len(kinds) == 1, line
    return DumpedBatch(fields, kinds[0])


def _record(line: str) -> DumpedRecord:
    m = _RECORD.match(line)
    assert m is not None, line[:300]
    headers = m["headers"]
    return DumpedRecord(
        int(m["offset"]),
        m["ts_type"],
        int(m["timestamp"]),
        int(m["key_size"]),
        int(m["value_size"]),
        int(m["sequence"]),
        headers.split(",") if headers else [],
        m["tail"],
    )


def parse_dump(text: str) -> dict[str, DumpedFile]:
    """DumpLogSegments' output of ``.log`` files by path (see the module doc)."""
    files: dict[str, DumpedFile] = {}
    current: DumpedFile | None = None
    for line in _lines(text):
        if line.startswith("Dumping "):
            current = files.setdefault(line[len("Dumping ") :], DumpedFile(line[len("Dumping ") :]))
        elif current is None:
            raise AssertionError(f"output before the first file: {line[:200]}")
        elif line.startswith("Log starting offset: "):
            current.log_start = int(line.split(": ", 1)[1])
        elif line.startswith("baseOffset: "):
            current.batches.append(_batch(line))
        elif line.startswith("| offset: "):
            assert current.batches, line[:200]
            current.batches[-1].records.append(_record(line))
        else:
            current.notes.append(line)
    return files


def parse_entries(text: str) -> dict[str, list[dict[str, str]]]:
    """DumpLogSegments' output of index, transaction index and producer snapshot files by path:
    one ``name: value`` dict per entry line (``offset: 79 position: 4721``, ``version: 0
    producerId: 3 firstOffset: ...``); ``<file> is empty.`` is a file without entries. A line that
    is not such pairs fails the parse."""
    files: dict[str, list[dict[str, str]]] = {}
    current: list[dict[str, str]] | None = None
    name = ""
    for line in _lines(text):
        if line.startswith("Dumping "):
            name = line[len("Dumping ") :]
            current = files.setdefault(name, [])
            continue
        if line == f"{name} is empty.":  # an index without entries
            continue
        tokens = line.split(" ")
        assert current is not None and len(tokens) % 2 == 0, line
        assert all(t.endswith(":") for t in tokens[0::2]), line
        current.append({n[:-1]: v for n, v in zip(tokens[0::2], tokens[1::2], strict=True)})
    return files


def problems(text: str) -> list[str]:
    """The lines of DumpLogSegments' output saying something is wrong (:data:`PROBLEM_WORDS`)."""
    return [
        line
        for line in _lines(text)
        if not line.startswith("| offset: ") and any(w.lower() in line.lower() for w in PROBLEM_WORDS)
    ]

"""The files of a pin on sight (docs/formats.md §7.4): ``<state dir>/pins/<base>/`` with the
segment's files hard-linked under their role names and ``pin.json``, and ``pins/refused.json``.
What they hold is counted by :mod:`rlm.tiering.local.pin_ledger`; :mod:`rlm.tiering.copy.sight` makes them.
Readers treat a file that does not parse as absent (rlm.tiering.local.statefiles)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rlm.formats import naming
from rlm.fsutil import atomic_write
from rlm.logdir.discovery import SegmentFiles
from rlm.tiering.local.statefiles import int_field, loads_or_none, str_field
from rlm.tiering.store import object_keys

__all__ = [
    "PINS_DIR",
    "PIN_FILE",
    "REFUSED_FILE",
    "Inode",
    "SightPin",
    "clear_refused",
    "linked_files",
    "read_pins",
    "read_refused",
    "write_refused",
]

PINS_DIR = "pins"
PIN_FILE = "pin.json"
REFUSED_FILE = "refused.json"

Inode = tuple[int, int]  # (st_dev, st_ino)

#: The broker's name of each role's file (the leader-epoch checkpoint is the partition's).
_SUFFIXES = {
    object_keys.OFFSET_INDEX: naming.INDEX,
    object_keys.TIME_INDEX: naming.TIME_INDEX,
    object_keys.TXN_INDEX: naming.TXN_INDEX,
    object_keys.PRODUCER_SNAPSHOT: naming.SNAPSHOT,
}


def linked_files(directory: Path) -> dict[Inode, int]:
    """(device, inode) → size in bytes of every regular file in ``directory`` but rlm's own
    ``pin.json``; {} when the directory is gone."""
    found: dict[Inode, int] = {}
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if entry.name.startswith(PIN_FILE):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    found[(st.st_dev, st.st_ino)] = st.st_size
    except (FileNotFoundError, NotADirectoryError):
        pass
    return found


def _inode(path: Path) -> Inode | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


@dataclass(frozen=True, slots=True)
class SightPin:
    """One segment pinned on sight: ``path`` holds its files under their role names. Offsets are
    Kafka's: ``next_base`` is the exclusive end of the segment's offsets (its next segment's base
    when it was pinned); ``files`` (device, inode) → bytes; ``pinned_ms`` epoch ms."""

    state_dir: Path
    log_dir: Path
    partition_dir: Path
    base_offset: int
    next_base: int
    pinned_ms: int
    files: Mapping[Inode, int] = field(default_factory=dict, compare=False)

    @property
    def path(self) -> Path:
        return self.state_dir / PINS_DIR / f"{self.base_offset:020d}"

    @property
    def pinned_bytes(self) -> int:
        return sum(self.files.values())

    @property
    def log_size(self) -> int:
        try:
            return (self.path / object_keys.LOG).stat().st_size
        except OSError:
            return 0

    def original(self) -> SegmentFiles:
        """The segment under the broker's names (the files may be gone): what a copy reports."""
        directory = self.partition_dir

        def named(role: str) -> Path | None:
            if not (self.path / role).exists():
                return None
            return directory / naming.segment_file_name(self.base_offset, _SUFFIXES[role])

        return SegmentFiles(
            self.base_offset,
            directory / naming.segment_file_name(self.base_offset, naming.LOG),
            self.log_size,
            named(object_keys.OFFSET_INDEX),
            named(object_keys.TIME_INDEX),
            named(object_keys.TXN_INDEX),
            named(object_keys.PRODUCER_SNAPSHOT),
        )

    def held(self) -> SegmentFiles:
        """The pinned files as a segment to pin again (``prepare.pin`` with ``path`` as the
        partition dir: the pinned ``leader-epoch-checkpoint`` keeps its name there)."""
        p = self.path

        def there(role: str) -> Path | None:
            return p / role if (p / role).exists() else None

        return SegmentFiles(
            self.base_offset,
            p / object_keys.LOG,
            self.log_size,
            there(object_keys.OFFSET_INDEX),
            there(object_keys.TIME_INDEX),
            there(object_keys.TXN_INDEX),
            there(object_keys.PRODUCER_SNAPSHOT),
        )

    def broker_still_has(self) -> bool:
        """Whether the broker's ``.log`` is still the pinned file: the pin then costs no disk."""
        pinned = _inode(self.path / object_keys.LOG)
        return pinned is not None and _inode(self.original().log) == pinned

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "base_offset": self.base_offset,
                "next_base": self.next_base,
                "log_dir": str(self.log_dir),
                "partition_dir": str(self.partition_dir),
                "pinned_ms": self.pinned_ms,
            }
        ).encode()

    @classmethod
    def read(cls, path: Path, state_dir: Path) -> SightPin | None:
        """The pin in ``path`` (a ``pins/<base>`` dir), None when it is not a whole one."""
        try:
            doc = loads_or_none((path / PIN_FILE).read_bytes())
        except OSError:
            return None
        base, end, at = (
            int_field(doc, "base_offset"),
            int_field(doc, "next_base"),
            int_field(doc, "pinned_ms"),
        )
        log_dir, part = str_field(doc, "log_dir"), str_field(doc, "partition_dir")
        if base is None or end is None or at is None or log_dir is None or part is None:
            return None
        if path.name != f"{base:020d}" or not (path / object_keys.LOG).exists():
            return None
        return cls(state_dir, Path(log_dir), Path(part), base, end, at, linked_files(path))


def read_pins(state_dir: Path) -> tuple[list[SightPin], list[Path]] | None:
    """The whole pins of a partition's state dir and what else is in its pins dir (a pin a crash
    cut short: removed by the partition's next pass, never counted); None without a pins dir."""
    pins: list[SightPin] = []
    leftovers: list[Path] = []
    try:
        entries = sorted(os.scandir(state_dir / PINS_DIR), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return None
    for entry in entries:
        if entry.name == REFUSED_FILE:
            continue
        pin = SightPin.read(Path(entry.path), state_dir) if entry.is_dir() else None
        if pin is None:
            leftovers.append(Path(entry.path))
        else:
            pins.append(pin)
    return pins, leftovers


def read_refused(state_dir: Path) -> tuple[Path, int, int] | None:
    """(log dir, oldest refused base, since ms) of a partition's persisted refusal."""
    try:
        doc = loads_or_none((state_dir / PINS_DIR / REFUSED_FILE).read_bytes())
    except OSError:
        return None
    base, since, log_dir = (
        int_field(doc, "base_offset"),
        int_field(doc, "since_ms"),
        str_field(doc, "log_dir"),
    )
    return None if base is None or since is None or log_dir is None else (Path(log_dir), base, since)


def write_refused(state_dir: Path, log_dir: Path, base: int, since_ms: int) -> None:
    """Persist a partition's refusal: the oldest pending segment the bound kept unpinned."""
    (state_dir / PINS_DIR).mkdir(parents=True, exist_ok=True)
    doc = {"base_offset": base, "since_ms": since_ms, "log_dir": str(log_dir)}
    atomic_write(state_dir / PINS_DIR / REFUSED_FILE, json.dumps(doc).encode())


def clear_refused(state_dir: Path) -> None:
    """The partition pins every pending segment again: its refusal is over."""
    (state_dir / PINS_DIR / REFUSED_FILE).unlink(missing_ok=True)

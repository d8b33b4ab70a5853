"""One declaration per configuration key (docs/configuration.md §5).

A key is a field of a settings dataclass whose ``metadata`` holds a :class:`Key`: the field gives
its name, type and default; the :class:`Key` its validator (which carries the allowed values as
data), its meaning and how its environment override is written. Everything else is derived from
these fields: validation (:func:`values_of`, :func:`table`), the environment variable names
(:attr:`Declared.env`) and the README reference (rlm/config/reference.py, via :func:`declared`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal, TypeVar

from rlm.config.validators import Validator, fail
from rlm.errors import ConfigError

__all__ = ["ENV_PREFIX", "Declared", "EnvForm", "Key", "declared", "key", "keys_of", "table", "values_of"]

ENV_PREFIX = "RLM_"
_META = "rlm.config.key"
T = TypeVar("T")

#: How a key is set from the environment: ``value`` — ``RLM_<SECTION>__<KEY>`` holds the value;
#: ``names`` — a table whose entries are set one by one, ``RLM_<SECTION>__<KEY>__<NAME>``;
#: ``inline`` — a table given whole as a TOML inline table (its names are case-sensitive, and
#: environment names are upper-cased); ``none`` — only through the table that holds it.
EnvForm = Literal["value", "names", "inline", "none"]


@dataclass(frozen=True, slots=True)
class Key:
    """What a settings field declares besides its name, type and default.

    ``table``: the value is a sub-table declared by its own settings class (one reference row per
    sub-key); ``each``: a table of such tables, one per name (``("<glob>", TopicOverride)``);
    ``then``: a check across the keys of the (sub-)table, run once it is read.
    """

    check: Validator
    doc: str = ""
    env: EnvForm = "value"
    table: type | None = None
    each: tuple[str, type] | None = None
    then: Callable[[Any], None] | None = None


def key(
    default: Any, check: Validator, doc: str, *, env: EnvForm = "value", each: tuple[str, type] | None = None
) -> Any:
    """A settings field declaring one key (an empty ``{}`` default becomes a fresh dict each time)."""
    meta = {_META: Key(check, doc, env, each=each)}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


def table(cls: type[T], *, then: Callable[[T], None] | None = None) -> T:
    """A settings field holding the sub-table ``cls`` (a section, or ``[remote.compression]``).

    As a sub-key its validator reads the table like a section: unknown keys are errors, each
    value is checked by its own key, ``then`` runs on the result.
    """

    def check(key: str, value: Any) -> T:
        if not isinstance(value, dict):
            raise fail(key, value, "must be a table")
        # Read in declaration order, so a key checked against another (active_key against
        # key_files) comes after it; unknown keys keep their place at the end.
        ordered = {**{name: value[name] for name in keys_of(cls) if name in value}, **value}
        out = cls(**values_of(cls, key, ordered))
        if then is not None:
            then(out)
        return out

    meta = {_META: Key(Validator(check, "table"), table=cls, then=then)}
    out: T = field(default_factory=cls, metadata=meta)
    return out


def keys_of(cls: type) -> dict[str, Key]:
    """The declared keys of a settings class, in declaration order (other fields are not keys)."""
    return {f.name: f.metadata[_META] for f in fields(cls) if _META in f.metadata}


def values_of(cls: type, where: str, raw: dict[str, Any], *, source: str = "") -> dict[str, Any]:
    """``raw`` checked key by key (in the file's order) against ``cls``'s declaration; an unknown
    key is one :class:`ConfigError` listing the known ones (``source``: the file, when given)."""
    keys = keys_of(cls)
    extra = sorted(set(raw) - set(keys))
    if extra:
        prefix = f"{source}: " if source else ""
        raise ConfigError(f"{prefix}unknown key {where}.{extra[0]}; known keys: {', '.join(keys)}")
    return {name: keys[name].check(f"{where}.{name}", value) for name, value in raw.items()}


@dataclass(frozen=True, slots=True)
class Declared:
    """One key as the reference shows it: its path from the root, declaration and default."""

    path: tuple[str, ...]
    key: Key
    default: Any

    @property
    def name(self) -> str:
        return ".".join(self.path)

    @property
    def env(self) -> str:
        """The environment variable that sets it ("" for ``none``)."""
        if self.key.env == "none":
            return ""
        name = ENV_PREFIX + "__".join(part.upper() for part in self.path)
        return name + "__<NAME>" if self.key.env == "names" else name


def _default(f: Any) -> Any:
    return f.default_factory() if f.default is MISSING else f.default


def declared(cls: type, path: tuple[str, ...] = ()) -> Iterator[Declared]:
    """Every key below ``cls`` in declaration order; a sub-table's keys replace its own row, the
    keys of ``each`` tables follow their table's row (path ``(..., "<glob>", key)``)."""
    for f in fields(cls):
        if _META not in f.metadata:
            continue
        spec: Key = f.metadata[_META]
        if spec.table is not None:
            yield from declared(spec.table, (*path, f.name))
            continue
        yield Declared((*path, f.name), spec, _default(f))
        if spec.each is not None:
            label, entry = spec.each
            for sub in declared(entry, (*path, f.name, label)):
                yield Declared(sub.path, Key(sub.key.check, sub.key.doc, "none"), sub.default)

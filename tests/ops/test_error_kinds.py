"""How errors surface is decided in one place: the class attributes of rlm/errors.py. Every
exception class of rlm lives there, and every one maps to an HTTP status and an exit code that the
contract docs (docs/http-api.md §5, docs/cli.md §1) state for it, and to a Kafka error code the
listener knows."""

from __future__ import annotations

import ast
import builtins
import inspect
import re
from pathlib import Path

import pytest

from rlm import errors
from rlm.cli.errors import exit_code_for
from rlm.errors import RlmError
from rlm.kafka.protocol import Codes
from rlm.kafka.reads import error_code

REPO = Path(__file__).resolve().parents[2]

ERROR_CLASSES = sorted(
    (
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == errors.__name__
    ),
    key=lambda cls: cls.__name__,
)
RLM_ERRORS = [cls for cls in ERROR_CLASSES if issubclass(cls, RlmError)]


def instance(cls: type[RlmError]) -> RlmError:
    """One error of ``cls`` as its raise sites build it."""
    if cls is errors.RlmHttpError:
        return errors.RlmHttpError(418, None, "teapot")
    return cls("something went wrong")


def _documented(text: str) -> list[tuple[int, list[str]]]:
    """The rows of docs/http-api.md §5's table: (status, class names in the class column)."""
    section = text.split("## 5. Errors", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d{3}) \|[^|]*\|([^|]*)\|$", section, re.MULTILINE)
    return [(int(status), re.findall(r"`(\w+)`", classes)) for status, classes in rows]


def _nearest_named(cls: type, names: set[str]) -> str | None:
    """The closest class of ``cls``'s MRO that ``names`` contains."""
    return next((c.__name__ for c in cls.__mro__ if c.__name__ in names), None)


def test_every_exception_class_of_rlm_lives_in_errors_py() -> None:
    error_names = {cls.__name__ for cls in ERROR_CLASSES}
    builtin_errors = {
        n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)
    }
    found = []
    for path in sorted([*(REPO / "rlm").rglob("*.py"), *(REPO / "plugins").rglob("*.py")]):
        if path == REPO / "rlm" / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
                if bases & (error_names | builtin_errors):
                    found.append(f"{path.relative_to(REPO)}: {node.name}")
    assert not found, f"exception classes outside rlm/errors.py: {found}"


@pytest.mark.parametrize("cls", RLM_ERRORS, ids=lambda c: c.__name__)
def test_every_error_class_has_the_http_status_the_contract_documents(cls: type[RlmError]) -> None:
    rows = _documented((REPO / "docs" / "http-api.md").read_text(encoding="utf-8"))
    named = {name for _, names in rows for name in names}
    documented = _nearest_named(cls, named)
    assert documented is not None, f"docs/http-api.md §5 names neither {cls.__name__} nor an ancestor"
    statuses = {status for status, names in rows if documented in names}
    assert statuses == {cls.http_status}, (cls.__name__, documented, statuses)


@pytest.mark.parametrize("cls", RLM_ERRORS, ids=lambda c: c.__name__)
def test_every_error_class_has_the_exit_code_the_contract_documents(cls: type[RlmError]) -> None:
    cli = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    rule = cli.split("- **Exit codes**", 1)[1].split("\n- **", 1)[0]
    usage = set(re.findall(r"`(\w+Error)`", rule.split("`2`", 1)[1].split("The error's class", 1)[0]))
    assert usage, "docs/cli.md §1 lists the classes that exit 2"
    expected = 2 if _nearest_named(cls, usage) is not None else 1
    assert cls.exit_code == expected, cls.__name__
    assert exit_code_for(instance(cls)) == expected


@pytest.mark.parametrize("cls", RLM_ERRORS, ids=lambda c: c.__name__)
def test_every_error_class_names_a_kafka_error_code(cls: type[RlmError]) -> None:
    assert cls.kafka_error in vars(Codes), cls.kafka_error
    assert error_code(instance(cls)) == getattr(Codes, cls.kafka_error)


def test_the_kafka_codes_of_the_read_path_errors() -> None:
    """The listener's contract (docs/kafka-listener.md): clients retry a store failure, re-list
    offsets on an out-of-range fetch, and treat an unknown or invalid topic as absent."""
    assert error_code(errors.StoreUnavailableError("down")) == Codes.KAFKA_STORAGE_ERROR
    assert error_code(errors.ObjectNotFoundError("gone")) == Codes.KAFKA_STORAGE_ERROR
    assert error_code(errors.OffsetOutOfRangeError("below")) == Codes.OFFSET_OUT_OF_RANGE
    assert error_code(errors.PartitionNotFoundError("nope")) == Codes.UNKNOWN_TOPIC_OR_PARTITION
    assert (
        error_code(errors.InvalidArgumentError("bad name", field="topic")) == Codes.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert error_code(errors.CorruptRecordError("bad crc")) == Codes.UNKNOWN_SERVER_ERROR
    assert error_code(ValueError("a bug")) == Codes.UNKNOWN_SERVER_ERROR


def test_a_store_miss_is_also_a_file_not_found() -> None:
    """A missing object is handled like a missing file by code that reads either tier, keeps
    rlm's one-line text and survives pickling (Spark and process pools carry errors back)."""
    import pickle

    err = errors.ObjectNotFoundError("no such key", file="s3://bucket/k", offset=7)
    assert isinstance(err, FileNotFoundError) and isinstance(err, errors.StorageError)
    assert str(err) == "s3://bucket/k: offset 7: no such key" and err.errno is None
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is errors.ObjectNotFoundError and str(back) == str(err)
    assert exit_code_for(err) == 1


@pytest.mark.parametrize("cls", RLM_ERRORS, ids=lambda c: c.__name__)
def test_every_error_survives_copy_and_pickle(cls: type[RlmError]) -> None:
    """``in_file`` copies an error and Spark / process pools pickle it back to the driver: both
    keep its class, text and field."""
    import pickle

    err = instance(cls).in_file("orders-0/00000000000000000000.log", base_position=3)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == str(err) and back.field == err.field

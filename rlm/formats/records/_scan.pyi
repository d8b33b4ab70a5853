"""Type stub of the compiled scanner (rlm/formats/records/_scan.c, docs/scan.md)."""

from collections.abc import Callable, Iterator

from rlm.formats.compression import Compression
from rlm.formats.records.types import Buffer, RecordBatch, TimestampType

#: CRC-32C paths this CPU runs, the one in use first: "avx512", "sse4.2", "table".
CRC_PATHS: tuple[str, ...]

class Scanner(Iterator[RecordBatch]):
    def __init__(
        self, buf: Buffer, start: int, end: int | None, verify_crc: bool, skip_crc: bool
    ) -> None: ...
    def __next__(self) -> RecordBatch: ...

def bind(
    cls: type[RecordBatch],
    codecs: tuple[Compression | None, ...],
    timestamp_types: tuple[TimestampType, ...],
    slow_step: Callable[[Buffer, int, int, bool, bool], RecordBatch | None],
    /,
) -> None: ...
def crc32c(data: Buffer, crc: int = 0, path: str = "auto") -> int: ...
def batches_crc32c(buf: Buffer, batches: list[RecordBatch], /) -> int | None: ...
def crc32c_combine(crc1: int, crc2: int, len2: int, /) -> int: ...

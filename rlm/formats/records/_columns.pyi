# Types of the C extension rlm/formats/records/_columns.c (docs/decoder.md).
from rlm.formats.records.types import Header, Record

ERR_FRAMING: int
ERR_RANGE: int
ERR_TOO_BIG: int
ERR_FALLBACK: int

class Builder:
    @property
    def rows(self) -> int: ...
    @property
    def pending_bytes(self) -> int: ...
    def add_v2(
        self,
        buf: object,
        start: int,
        end: int,
        base_offset: int,
        base_ts: int,
        max_ts: int,
        log_append: bool,
        ts_type: int,
        count: int,
        lo: int,
        hi: int,
        ts_lo: int,
        ts_hi: int,
        has_ts_lo: bool,
        has_ts_hi: bool,
    ) -> int: ...
    def add_legacy(
        self,
        set_: object,
        wrapper_offset: int,
        magic: int,
        wrapper_ts: int,
        log_append: bool,
        ts_type: int,
        lo: int,
        hi: int,
        ts_lo: int,
        ts_hi: int,
        has_ts_lo: bool,
        has_ts_hi: bool,
    ) -> int: ...
    def append_row(
        self, offset: int, timestamp_ms: int, ts_type: int, key: bytes | None, value: bytes | None
    ) -> int: ...
    def take(
        self, n: int
    ) -> tuple[
        int,
        bytes,
        bytes,
        bytes,
        bytes | None,
        bytes,
        bytes,
        bytes | None,
        bytes,
        bytes,
        bytes | None,
        bytes,
        int,
        bytes,
        bytes,
        bytes | None,
        bytes,
        bytes,
    ]: ...

def configure(record: type[Record], header: type[Header]) -> None: ...
def records_v2(
    buf: object,
    start: int,
    end: int,
    base_offset: int,
    base_ts: int,
    max_ts: int,
    log_append: bool,
    count: int,
) -> list[Record] | int: ...

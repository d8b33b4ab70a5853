"""rlm.formats.records.scan.crc32c_combine (compiled, and the Python one beside it) against the
crc32c library's CRC-32C of the concatenation (the s3 plugin combines the parts' checksums into
the file's: a wrong combine fails every copy's checksum, so it is checked here on its own, on
random splits and the edge lengths)."""

from __future__ import annotations

import random
from typing import Any

import crc32c
import pytest

from rlm.formats.records import scan


def _python(crc1: int, crc2: int, len2: int) -> int:
    return crc1 if len2 <= 0 else scan._multmodp(scan._x8nmodp(len2), crc1) ^ crc2


@pytest.fixture(params=["scan", "python"])
def crc32c_combine(request: pytest.FixtureRequest) -> Any:
    return scan.crc32c_combine if request.param == "scan" else _python


def test_combine_equals_the_crc_of_the_concatenation(crc32c_combine: Any) -> None:
    rng = random.Random(35)
    for _ in range(200):
        a = rng.randbytes(rng.choice([0, 1, 7, rng.randrange(1, 5000)]))
        b = rng.randbytes(rng.choice([1, 3, 64, rng.randrange(1, 70_000)]))
        assert crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b)) == crc32c.crc32c(a + b)


def test_combining_many_parts_in_order(crc32c_combine: Any) -> None:
    rng = random.Random(7)
    data = rng.randbytes(3 << 20)
    cuts = sorted(rng.sample(range(1, len(data)), 40))
    crc, start = 0, 0
    for end in [*cuts, len(data)]:
        crc = crc32c_combine(crc, crc32c.crc32c(data[start:end]), end - start)
        start = end
    assert crc == crc32c.crc32c(data)


def test_an_empty_second_part_changes_nothing(crc32c_combine: Any) -> None:
    assert crc32c_combine(0x1234ABCD, 0, 0) == 0x1234ABCD

"""Regression tests for what the fuzz suite found, one per finding, named after it (docs/fuzzing.md)."""

from __future__ import annotations

import pytest

from rlm.errors import CompressionError
from rlm.formats.records import iter_batches
from tests.formats.test_records import legacy_message


def test_legacy_unknown_codec_error_names_position_and_offset() -> None:
    # Finding: a v0/v1 message with codec bits 5-7 raised CompressionError without a position or
    # offset, so `rlm dump` and the copier could not say where the bad message was.
    data = legacy_message(0, 1, None, b"v") + legacy_message(7, 0, None, b"x", attrs=7)
    with pytest.raises(CompressionError) as info:
        list(iter_batches(data))
    assert info.value.position == len(legacy_message(0, 1, None, b"v"))
    assert info.value.offset == 7
    assert "codec id 7" in str(info.value)
